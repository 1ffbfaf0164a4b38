# Put on PYTHONPATH as sitecustomize.py with BUILD_LOG=FILE; ran with compile_models.py --skip-tune
# --models vit --cases b64 --contenders tunehub,default --rounds 1 --reps 2.
# Probe: log every gcc build Triton makes (thread, module name, source hash, caller frames).
import hashlib, os, threading, time, traceback
def _install():
    try:
        import triton.runtime.build as build
    except Exception:
        return
    original = build._build
    def logged(name, src_path, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(name, src_path, *args, **kwargs)
        finally:
            with open(src_path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:12]
            frames = [f"{os.path.basename(fr.filename)}:{fr.lineno}:{fr.name}" for fr in traceback.extract_stack()[-14:-1]]
            with open(os.environ["BUILD_LOG"], "a") as out:
                out.write(f"pid={os.getpid()} thread={threading.current_thread().name} name={name} src={digest} secs={time.perf_counter()-start:.3f}\n  " + " <- ".join(reversed(frames)) + "\n")
    build._build = logged
    orig_cms = build.compile_module_from_src
    def cms(src, name, *a, **k):
        digest = hashlib.sha256(src.encode()).hexdigest()[:12]
        with open(os.environ["BUILD_LOG"], "a") as out:
            out.write(f"pid={os.getpid()} thread={threading.current_thread().name} compile_module_from_src name={name} src={digest} TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR')}\n")
        return orig_cms(src, name, *a, **k)
    build.compile_module_from_src = cms
    try:
        import triton.backends.nvidia.driver as drv
        drv.compile_module_from_src = cms
    except Exception as exc:
        with open(os.environ["BUILD_LOG"], "a") as out:
            out.write(f"no driver patch: {exc}\n")
if os.environ.get("BUILD_LOG"):
    _install()
