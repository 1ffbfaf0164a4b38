"""Probe (2026-11-27, one lent H200; ran as cachediag.py from the checkout root, its path
to benchmarks/ adjusted here): cold then warm compiles of ViT-B b64 through one cache
directory, listing Triton's cache after each process (which kernel did a warm process compile
again?). Written down in docs/benchmarks.md ("Compile time: the caches"); removed after."""

import glob
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import compile_models as cm
from local_service import local_service

contender = sys.argv[1]
out = Path(os.environ["OUT"])
spec = {
    "model": "vit",
    "case": "b64",
    "contender": contender,
    "device": "cuda",
    "dtype": "float16",
    "dims": {"layers": 4, "hidden": 768, "vocab": 50304},
    "batch": 64,
    "seq": 197,
    "dynamic": False,
    "reps": 5,
    "rounds": 1,
    "cpus": list(range(8, 16)),
    "tunehub_options": None,
}


def listing(tmp):
    rows = {}
    for meta in glob.glob(f"{tmp}/**/*.json", recursive=True):
        if "__grp__" in meta:
            continue
        try:
            d = json.load(open(meta))  # noqa: SIM115
        except Exception:
            continue
        if isinstance(d, dict) and "name" in d and "hash" in d:
            rows[meta.replace(tmp, "")] = d if "gemm" in d["name"] else d["hash"]
    return rows


with local_service(
    None, None, gpus="auto", home=Path("/tmp/cm"), TUNEHUB_TRAIN_MODELS="false"
) as svc:
    env = {"TUNEHUB_URL": svc.url, "TUNEHUB_CLIENT_DEADLINE_SECS": "5"}
    tmp = tempfile.mkdtemp(prefix="cachediag-")
    report = {}
    for n in ("cold", "warm", "warm2"):
        r = cm._run_in(tmp, spec, env, 600)
        report[n] = {
            "compile_secs": r.get("compile_secs"),
            "caches": r.get("caches"),
            "tunehub": (r.get("tunehub") or {}).get("compile_secs"),
            "error": (r.get("error") or "")[-2000:],
            "triton_cache": listing(tmp),
        }
    # the generated code's kernel sources (user kernel)
    srcs = glob.glob(f"{tmp}/inductor/**/*.py", recursive=True)
    report["py_files"] = [s.replace(tmp, "") for s in srcs][:200]
    (out / f"cachediag-{contender}.json").write_text(json.dumps(report, indent=1))
    os.system(
        f"cd {tmp} && tar czf {out}/cachediag-{contender}-tree.tgz --exclude='*.cubin' --exclude='*.so' --exclude='*.ptx' --exclude='*.llir' --exclude='*.ttgir' --exclude='*.ttir' --exclude='*.json' inductor/ 2>/dev/null; ls -R {tmp} | head -300 > {out}/cachediag-{contender}-ls.txt"  # noqa: E501
    )
