"""Measurement over Ray: one actor per device of each tunehub worker node, pools per target.

How it fits together (docs/ray.md has the long form):

- A machine joins with ``tunehub worker --address ADDR``: a Ray node that advertises custom
  resources, ``tunehub_cpu`` (it offers its CPU) and ``tunehub_gpu_<i>`` (it offers GPU ``i``),
  and ``tunehub_claim_<target_key>`` when it was told which target it must be.
- A driver (``tunehub serve --ray ADDR``) runs a :class:`RayCluster`: it looks at the cluster's
  nodes, and on each node with such resources it creates (pinned to that node) one
  :class:`MeasureActor` per offered device. The actors are the driver's own (not detached), so
  when the driver dies Ray kills them, and their sandboxes exit with them: nothing goes on
  measuring for nobody. Each actor wraps a :class:`LocalMeasurer` (sandboxes, host-wide device
  and core locks) and fingerprints its device when it starts; an actor whose fingerprint
  differs from the node's claim is refused and killed.
- Actors are grouped by target into a :class:`TargetPool`. A :class:`RayMeasurer` is one job's
  client of a pool: it sends each request to the actor with the least work per slot, and one
  dispatcher thread per driver waits (``ray.wait``) on every outstanding call and resolves
  the futures the Session consumes as results come back. A call whose actor died is sent to
  another actor of the target (at most ``retries`` times, then ``worker_error``); with no
  actor left it is answered ``cancelled`` (not a verdict: measured again when one joins).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tunehub.core import MeasureRequest, MeasureResult, MeasureStatus, Target
from tunehub.workers.base import Measurer, cancelled_result, resolve

log = logging.getLogger(__name__)

CPU_RESOURCE = "tunehub_cpu"
GPU_RESOURCE_PREFIX = "tunehub_gpu_"
CLAIM_RESOURCE_PREFIX = "tunehub_claim_"
# What an actor takes of its node's custom resource: a sliver, so every driver (API replica)
# places its own actor on the same device; the host-wide device lock keeps timing exclusive.
RESOURCE_SLIVER = 0.001
DEFAULT_RETRIES = 2
START_TIMEOUT_SECS = 180.0
RETRY_REFUSED_SECS = 60.0
WAIT_SECS = 0.05
ACTOR_CONCURRENCY = 256
MAX_EARLY_CANCELS = 10_000
NO_WORKER_LEFT = "no worker of the target is left; measured again when one joins"


def node_resources(*, cpu: bool, gpus: Iterable[int], claim: str | None = None) -> dict[str, float]:
    """The custom resources a tunehub worker node advertises (see the module docstring)."""
    out: dict[str, float] = {}
    if cpu:
        out[CPU_RESOURCE] = 1.0
    for index in gpus:
        out[f"{GPU_RESOURCE_PREFIX}{index}"] = 1.0
    if claim:
        out[f"{CLAIM_RESOURCE_PREFIX}{claim}"] = 1.0
    return out


def node_devices(resources: Mapping[str, float]) -> tuple[list[str], str | None]:
    """The devices a node offers (``cpu``, ``cuda:N``) and the target key it claims."""
    devices = ["cpu"] if resources.get(CPU_RESOURCE, 0) > 0 else []
    claim = None
    for name in sorted(resources):
        if name.startswith(GPU_RESOURCE_PREFIX) and name[len(GPU_RESOURCE_PREFIX) :].isdigit():
            devices.append(f"cuda:{name[len(GPU_RESOURCE_PREFIX) :]}")
        elif name.startswith(CLAIM_RESOURCE_PREFIX):
            claim = name[len(CLAIM_RESOURCE_PREFIX) :]
    return devices, claim


def fingerprint_difference(claimed: Target | None, claimed_key: str, found: Target) -> str:
    """Why ``found`` is not the claimed target, in words (fields that differ where known)."""
    if claimed is None:
        return (
            f"it claims target {claimed_key[:12]} but its device is {found.short_label}, "
            "a different fingerprint"
        )
    want, have = claimed.to_dict(), found.to_dict()
    fields = [k for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]
    # Each field as claimed and as found: another GPU, driver or ISA flag is named as such.
    details = "; ".join(f"{k}: {want.get(k)!r} claimed, {have.get(k)!r} found"[:200]
                        for k in fields)  # fmt: skip
    return (
        f"it claims target {claimed.short_label} but its device is {found.short_label} "
        f"(differs in {details or 'key'})"
    )


# --- the actor, on the worker node ---------------------------------------------------------------
class MeasureActor:
    """One device of one node: a LocalMeasurer and the calls it is serving.

    Runs as a threaded Ray actor: each ``measure`` call blocks one of its threads until the
    LocalMeasurer resolves the request, so results return in the order they finish.
    """

    def __init__(self, device: str, options: dict[str, Any]) -> None:
        from tunehub.workers.local import LocalMeasurer

        options = dict(options)
        home = Path(os.environ.get("TUNEHUB_HOME") or "~/.tunehub").expanduser()
        if options.get("build_dir") is None:
            options["build_dir"] = home / "build"
        if options.get("workdir") is None:
            # Sandbox logs and temp files, named by pid: an actor killed with its driver
            # cannot clean up, so the next one on the node removes what dead actors left.
            workdirs = home / "ray-actors"
            _remove_dead_workdirs(workdirs)
            options["workdir"] = workdirs / f"{device.replace(':', '-')}-{os.getpid()}"
        self.device = device
        self.measurer = LocalMeasurer(device=device, **options)
        self.target = self.measurer.target  # the fingerprint, taken now (a GPU's in a sandbox)
        self._lock = threading.Lock()
        self._calls: dict[tuple[str, int], tuple[Future[MeasureResult], int | None]] = {}
        # Cancels that came before their call (a threaded actor runs calls in any order).
        self._cancelled: set[tuple[str, int]] = set()

    def describe(self) -> dict[str, Any]:
        """What the driver registers: the fingerprint and where the actor runs."""
        return {
            "target": self.target.to_dict(),
            "device": self.device,
            "device_name": self.target.name,
            "capacity": self.measurer.capacity,
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    def measure(
        self, caller: str, call_id: int, job_id: int | None, request: MeasureRequest
    ) -> MeasureResult:
        with self._lock:
            if (caller, call_id) in self._cancelled:
                self._cancelled.discard((caller, call_id))
                return cancelled_result()
            future = self.measurer.submit(request)
            self._calls[(caller, call_id)] = (future, job_id)
        try:
            return future.result()
        finally:
            with self._lock:
                self._calls.pop((caller, call_id), None)

    def cancel(self, caller: str, call_ids: list[int] | None = None) -> int:
        """Cancel the caller's calls (all of them without ``call_ids``); how many."""
        with self._lock:
            futures = [
                future
                for (who, call_id), (future, _) in self._calls.items()
                if who == caller and (call_ids is None or call_id in call_ids)
            ]
            known = {call_id for who, call_id in self._calls if who == caller}
            if len(self._cancelled) > MAX_EARLY_CANCELS:  # those of calls that had finished
                self._cancelled.clear()
            self._cancelled.update((caller, i) for i in call_ids or () if i not in known)
        self.measurer.cancel(futures)
        return len(futures)

    def status(self) -> dict[str, Any]:
        """Live state: ``timing`` (a candidate on the device), ``building`` or ``idle``, and
        the job and config of the candidate being timed (else of one being built)."""
        with self._lock:
            jobs = {future: job_id for future, job_id in self._calls.values()}
        active = self.measurer.in_progress()
        state, job_id, config = "idle", None, None
        for wanted in ("running", "building"):
            for future, request, item_state in active:
                if item_state == wanted:
                    state = "timing" if wanted == "running" else "building"
                    job_id, config = jobs.get(future), dict(request.config)
                    break
            if state != "idle":
                break
        return {"state": state, "job_id": job_id, "config": config, "in_flight": len(jobs)}

    def close(self) -> None:
        self.measurer.close()


def _remove_dead_workdirs(root: Path) -> None:
    for path in root.glob("*-*"):
        pid = path.name.rpartition("-")[2]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _actor_class() -> Any:
    return ray.remote(MeasureActor)


# --- the driver's side -------------------------------------------------------------------------
@dataclass(eq=False)
class ActorSlot:
    """One live actor as the driver sees it."""

    actor: Any
    node_id: str
    device: str
    target: Target
    capacity: int
    host: str
    pid: int
    worker_id: str = field(default_factory=lambda: f"ray-{uuid.uuid4().hex[:16]}")
    in_flight: int = 0
    alive: bool = True
    lost_reason: str = ""  # why it was dropped

    @property
    def device_name(self) -> str:
        return self.target.name


@dataclass(eq=False)
class _Call:
    request: MeasureRequest
    future: Future[MeasureResult]
    client: RayMeasurer
    call_id: int
    attempts: int = 0
    slot: ActorSlot | None = None
    errors: list[str] = field(default_factory=list)


class TargetPool:
    """The live actors of one target in this driver; shared by every job of the target."""

    def __init__(self, cluster: RayCluster, target: Target) -> None:
        self.cluster = cluster
        self.target = target
        self.slots: list[ActorSlot] = []

    @property
    def capacity(self) -> int:
        with self.cluster.lock:
            return sum(s.capacity for s in self.slots if s.alive)

    @property
    def live(self) -> bool:
        with self.cluster.lock:
            return any(s.alive for s in self.slots)

    def pick(self) -> ActorSlot | None:
        """The live actor with the least work per slot (caller holds the cluster's lock)."""
        live = [s for s in self.slots if s.alive]
        if not live:
            return None
        return min(live, key=lambda s: (s.in_flight / max(1, s.capacity), s.in_flight))


class RayMeasurer(Measurer):
    """One job's client of a target's actors; futures resolve as the actors answer.

    ``job_id`` only labels the calls (the actors report which job they measure for).
    """

    def __init__(
        self,
        pool: TargetPool,
        *,
        job_id: int | None = None,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        self.pool = pool
        self.job_id = job_id
        self.retries = max(0, retries)
        self.caller = f"{pool.cluster.driver_id}-{uuid.uuid4().hex[:8]}"
        self._ids = itertools.count()
        self._calls: dict[Future[MeasureResult], _Call] = {}
        self._closed = False

    @property
    def capacity(self) -> int:
        return max(1, self.pool.capacity)

    @property
    def target(self) -> Target:
        return self.pool.target

    def submit(self, request: MeasureRequest) -> Future[MeasureResult]:
        if self._closed:
            raise RuntimeError("RayMeasurer is closed")
        future: Future[MeasureResult] = Future()
        future.set_running_or_notify_cancel()
        call = _Call(request, future, self, next(self._ids))
        with self.pool.cluster.lock:
            self._calls[future] = call
        future.add_done_callback(self._forget)
        self.pool.cluster.dispatch(self.pool, call)
        return future

    def _forget(self, future: Future[MeasureResult]) -> None:
        with self.pool.cluster.lock:
            self._calls.pop(future, None)

    def cancel(self, futures: Iterable[Future[MeasureResult]]) -> None:
        """Answer ``cancelled`` now; the actors kill the sandboxes working on them."""
        futures = list(futures)
        by_actor: dict[ActorSlot, list[int]] = {}
        with self.pool.cluster.lock:
            calls = [self._calls.get(f) for f in futures]
        for future, call in zip(futures, calls, strict=False):
            if call is not None and call.slot is not None:
                by_actor.setdefault(call.slot, []).append(call.call_id)
            resolve(future if call is None else call.future, cancelled_result())
        for slot, ids in by_actor.items():
            if slot.alive:
                slot.actor.cancel.remote(self.caller, ids)

    def close(self) -> None:
        with self.pool.cluster.lock:
            self._closed = True
            pending = list(self._calls)
        self.cancel(pending)


class RayCluster:
    """This driver's view of a Ray cluster: its tunehub actors by target, and the thread that
    turns their answers into resolved futures.

    ``refresh`` (called by the runner's heartbeat) creates actors on nodes that joined and
    drops those that died. ``options`` are the LocalMeasurer settings every actor gets.
    """

    def __init__(
        self,
        address: str,
        *,
        options: Mapping[str, Any] | None = None,
        retries: int = DEFAULT_RETRIES,
        start_timeout_secs: float = START_TIMEOUT_SECS,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        self.options = dict(options or {})
        self.retries = retries
        self.start_timeout_secs = start_timeout_secs
        self.driver_id = uuid.uuid4().hex[:12]
        self.lock = threading.RLock()
        self.pools: dict[str, TargetPool] = {}
        self.slots: dict[tuple[str, str], ActorSlot] = {}  # (node id, device) -> slot
        self.refused: dict[tuple[str, str], tuple[float, str]] = {}
        self._lost: list[ActorSlot] = []  # dropped since the last refresh
        self._refs: dict[Any, _Call] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._owns_ray = False
        if not ray.is_initialized():
            if address == "local":
                # This machine is the cluster: its CPU (and GPUs the caller names) are offered.
                # address="local" (not None): a new instance even where RAY_ADDRESS or the
                # address file `ray start` leaves names a cluster, which ray.init() would join.
                ray.init(
                    address="local",
                    resources=dict(resources or node_resources(cpu=True, gpus=())),
                    include_dashboard=False,
                    log_to_driver=False,
                )
            else:
                ray.init(address=address, log_to_driver=False)
            self._owns_ray = True
        self.address = address
        self._thread = threading.Thread(target=self._collect, name="tunehub-ray", daemon=True)
        self._thread.start()

    # --- discovery -----------------------------------------------------------------------------
    def refresh(
        self, known_target: Callable[[str], Target | None] | None = None
    ) -> tuple[list[ActorSlot], list[ActorSlot]]:
        """Create actors for the devices of nodes that joined; forget those of dead actors
        and nodes. Returns (added, removed). ``known_target`` finds the target a node claims
        (the store's), so a refusal names the fields that differ."""
        nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
        added: list[ActorSlot] = []
        with self.lock:
            for key, slot in list(self.slots.items()):
                if key[0] not in nodes:
                    self._drop(slot, "its node left the cluster")
            removed, self._lost = self._lost, []
        for node_id, node in nodes.items():
            devices, claim = node_devices(node.get("Resources", {}))
            for device in devices:
                key = (node_id, device)
                with self.lock:
                    if key in self.slots:
                        continue
                refused = self.refused.get(key)
                if refused is not None and time.monotonic() - refused[0] < RETRY_REFUSED_SECS:
                    continue
                started = self._start_actor(node_id, device, claim, known_target)
                if started is not None:
                    added.append(started)
        return added, removed

    def _start_actor(
        self,
        node_id: str,
        device: str,
        claim: str | None,
        known_target: Callable[[str], Target | None] | None = None,
    ) -> ActorSlot | None:
        resource = CPU_RESOURCE if device == "cpu" else GPU_RESOURCE_PREFIX + device[5:]
        actor = (
            _actor_class()
            .options(
                num_cpus=0,
                resources={resource: RESOURCE_SLIVER},
                max_concurrency=ACTOR_CONCURRENCY,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(device, self.options)
        )
        where = f"{device} on node {node_id[:12]}"
        try:
            info = ray.get(actor.describe.remote(), timeout=self.start_timeout_secs)
        except Exception as exc:
            log.error("no worker for %s: it did not start: %s", where, exc)
            ray.kill(actor)
            self.refused[(node_id, device)] = (time.monotonic(), f"did not start: {exc}")
            return None
        target = Target.from_dict(info["target"])
        if claim is not None and claim != target.target_key:
            claimed = None
            if known_target is not None:
                try:
                    claimed = known_target(claim)
                except Exception as exc:  # the database away: refused all the same
                    log.debug("could not look up the claimed target: %s", exc)
            why = fingerprint_difference(claimed, claim, target)
            log.error("refused the worker for %s on %s: %s", where, info["host"], why)
            ray.kill(actor)
            self.refused[(node_id, device)] = (time.monotonic(), why)
            return None
        slot = ActorSlot(
            actor=actor,
            node_id=node_id,
            device=device,
            target=target,
            capacity=int(info["capacity"]),
            host=str(info["host"]),
            pid=int(info["pid"]),
        )
        with self.lock:
            self.slots[(node_id, device)] = slot
            self.pools.setdefault(target.target_key, TargetPool(self, target)).slots.append(slot)
        log.info("ray worker %s: %s on %s (%s)", slot.worker_id, device, slot.host,
                 target.short_label)  # fmt: skip
        return slot

    def _drop(self, slot: ActorSlot, why: str) -> None:
        """Forget ``slot`` and send its calls elsewhere (caller holds the lock)."""
        if not slot.alive:
            return
        slot.alive = False
        slot.lost_reason = why
        self._lost.append(slot)
        self.slots.pop((slot.node_id, slot.device), None)
        pool = self.pools.get(slot.target.target_key)
        if pool is not None and slot in pool.slots:
            pool.slots.remove(slot)
        log.warning("ray worker %s (%s on %s) is gone: %s", slot.worker_id, slot.device,
                    slot.host, why)  # fmt: skip
        for ref, call in list(self._refs.items()):
            if call.slot is slot:
                del self._refs[ref]
                self._retry(call, f"the worker {slot.worker_id} on {slot.host} was lost: {why}")
        with _suppress():
            ray.kill(slot.actor)

    def pool(self, target_key: str) -> TargetPool | None:
        with self.lock:
            return self.pools.get(target_key)

    def measurer(self, target_key: str, *, job_id: int | None = None) -> RayMeasurer:
        """A client of the target's actors for one job (KeyError: no actor of the target)."""
        pool = self.pool(target_key)
        if pool is None:
            raise KeyError(f"no ray worker of target {target_key[:12]}")
        return RayMeasurer(pool, job_id=job_id, retries=self.retries)

    def statuses(self, timeout_secs: float = 5.0) -> dict[str, dict[str, Any]]:
        """Every live actor's state by worker id (those that do not answer in time left out)."""
        with self.lock:
            slots = [s for s in self.slots.values() if s.alive]
        asked = {slot.worker_id: slot.actor.status.remote() for slot in slots}
        deadline = time.monotonic() + timeout_secs
        out: dict[str, dict[str, Any]] = {}
        for worker_id, ref in asked.items():
            try:
                out[worker_id] = ray.get(ref, timeout=max(0.01, deadline - time.monotonic()))
            except Exception:
                continue
        return out

    # --- calls ---------------------------------------------------------------------------------
    def dispatch(self, pool: TargetPool, call: _Call) -> None:
        with self.lock:
            if call.future.done():
                return
            slot = pool.pick()
            if slot is None:
                resolve(call.future, cancelled_result(NO_WORKER_LEFT))
                return
            call.slot = slot
            call.attempts += 1
            slot.in_flight += 1
            client = call.client
            ref = slot.actor.measure.remote(client.caller, call.call_id, client.job_id,
                                            call.request)  # fmt: skip
            self._refs[ref] = call
        self._wake.set()

    def _retry(self, call: _Call, error: str) -> None:
        """Send ``call`` to another actor of its target, or answer ``worker_error`` when it
        has had its tries (caller holds the lock)."""
        if call.slot is not None:
            call.slot.in_flight = max(0, call.slot.in_flight - 1)
            call.slot = None
        call.errors.append(error)
        if call.future.done():
            return
        if call.attempts > call.client.retries:
            resolve(
                call.future,
                MeasureResult(
                    MeasureStatus.WORKER_ERROR,
                    error=f"lost {call.attempts} workers while measuring it; last: {error}",
                ),
            )
            return
        log.warning("retrying %s %s on another worker: %s", call.request.template,
                    call.request.config, error)  # fmt: skip
        self.dispatch(call.client.pool, call)

    def _collect(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                refs = list(self._refs)
            if not refs:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            # Wake for the first answer, then take every other one that is in too.
            ready, rest = ray.wait(refs, num_returns=1, timeout=WAIT_SECS)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref in ready:
                self._answer(ref)

    def _answer(self, ref: Any) -> None:
        with self.lock:
            call = self._refs.pop(ref, None)
        if call is None:
            return
        try:
            result: MeasureResult = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            with self.lock:
                slot = call.slot
                if slot is not None and slot.alive:
                    self._drop(slot, _first_line(exc))
                self._retry(call, _first_line(exc))
            return
        except Exception as exc:  # a bug or a lost object: the machine's failure, not the config's
            with self.lock:
                self._retry(call, f"{type(exc).__name__}: {_first_line(exc)}")
            return
        with self.lock:
            if call.slot is not None:
                call.slot.in_flight = max(0, call.slot.in_flight - 1)
        resolve(call.future, result)

    def kill_slot(self, slot: ActorSlot) -> None:
        """Kill an actor (tests, operators); its calls go elsewhere when Ray says it died."""
        ray.kill(slot.actor, no_restart=True)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        with self.lock:
            calls = list(self._refs.values())
            self._refs.clear()
            slots = list(self.slots.values())
            self.slots.clear()
            self.pools.clear()
        for call in calls:
            resolve(call.future, cancelled_result())
        for slot in slots:
            slot.alive = False
            with _suppress():
                ray.kill(slot.actor)
        if self._owns_ray:
            ray.shutdown()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class _suppress:
    """Swallow and log what a best-effort cleanup raises."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        if exc is not None:
            log.debug("cleanup: %s", exc)
        return True
