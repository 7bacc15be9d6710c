"""What the ranks of the elastic tests run, and how a test reads back what they did.

`train` is Horovod's elastic pattern: an MLP with DistributedOptimizer, an ElasticSampler over a
fixed dataset (or, with `data`, that dataset written by `hora.data.from_spark` and read through
its loader), a TorchState committed every `commit_every` steps and at each epoch's end, all in
`hvd.elastic.run`. With `fsdp`, a second copy of the MLP sharded with FSDP2 trains on the same
batches in the same state (committed as a DCP checkpoint to a shared folder; with `reshard`, the
state rebuilds it in a world re-formed in place). Every rank logs
each step (attempt, world size, epoch, the commit it follows, the sample indices) to the test's
folder; `kept_steps` keeps the steps that the run's final model contains (a failed attempt's
steps after the commit the next attempt resumed from were rolled back), and `reference` trains
those steps in one process.

The model is float64: the ranks' cross-host sum (gloo, shared memory) adds in another order than
one process does, so the weights cannot be bitwise equal; in float64 they agree to ~1e-12.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

HOST_MARK = "kill-host"  # a rank wrote its host here: the test makes that host vanish
SMALL_MARK = "small"  # an attempt below the full size made its first commit
BACK_MARK = "back"  # the test brought the lost capacity back
KILLED_MARK = "killed"  # when the faulty rank killed itself (time.time())
FIRST_JOINER_MARK = "first-joiner"  # made (exclusively) by the first rank started to grow
RUNNING_KILLED_MARK = "running-killed"  # a running rank killed itself while a new one started
START_KILLED_MARK = "start-killed"  # the last rank of the first world killed itself before init
END_KILLED_MARK = "end-killed"  # the last rank killed itself after the run's last commit
#: when the last rank of the first re-formed world killed itself past its presence barrier
WINDOW_KILLED_MARK = "window-killed"
#: the last rank of the first world killed itself in its hvd.elastic.run, before it said so
RUN_KILLED_MARK = "run-killed"


@dataclass(frozen=True)
class Plan:
    folder: str
    full: int  # the world size the run grows back to (max_np)
    epochs: int = 3
    samples: int = 96
    batch: int = 4
    commit_every: int = 2
    lr: float = 0.05
    step_seconds: float = 0.05  # paces the steps, so that the driver's signals arrive mid-run
    #: "self": the last rank SIGKILLs itself; "actor": it SIGKILLs the Ray actor supervising it
    #: and lives on, training no further; "host": it writes its host to HOST_MARK and waits for
    #: the test to kill the host; in attempt `fault_attempt`, in the step after the attempt's
    #: `fault_commit`-th commit
    fault: str | None = None
    fault_attempt: int = 0
    fault_commit: int = 1
    #: below the full size, wait at the first commit until the test wrote BACK_MARK
    wait_for_return: bool = False
    fsdp: bool = False
    #: with `fsdp`: the TorchState's `reshard=`, so that the sharded copy re-forms in place
    reshard: bool = False
    #: a hora.data.Dataset of `dataset(samples)` (columns id, x, y: `data_frame`): the samples
    #: come through its loader, committed in the TorchState, instead of an ElasticSampler
    data: Any = None
    #: each step's loss through hora.report
    report: bool = False
    #: the ranks the fault kills at once (default: the last one)
    fault_ranks: tuple[int, ...] | None = None
    #: a fault in the first growth in place: "before" (the first new rank SIGKILLs itself before
    #: init), "after_init" (... once its init returned: the running ranks re-form with it), or
    #: "running" (rank 0, holding its commit, SIGKILLs itself while the first new rank starts)
    joiner_fault: str | None = None
    #: the last rank of the attempt's first world SIGKILLs itself before its hvd.init()
    start_fault: bool = False
    #: the last rank SIGKILLs itself after the run's last commit, before its run returns
    end_fault: bool = False
    #: the last rank of the first world re-formed in place SIGKILLs itself past that world's
    #: presence barrier, before torch's own rendezvous (gloo's, in init_process_group)
    window_fault: str | None = None  # "rendezvous" or "tree": see `_arm_window_fault`
    #: the last rank of the first world SIGKILLs itself in its hvd.elastic.run, past its resume
    #: and before it says it can re-form, once every other rank started its loop
    run_fault: bool = False


def dataset(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(samples, 6, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def data_frame(spark: Any, samples: int) -> Any:
    """`dataset(samples)` as a Spark DataFrame (id, x, y; doubles, so read back bit for bit),
    in 4 partitions: Parquet files written on every host's executors."""
    x, y = dataset(samples)
    rows = [(i, x[i].tolist(), y[i].tolist()) for i in range(samples)]
    schema = "id long, x array<double>, y array<double>"
    return spark.createDataFrame(rows, schema).repartition(4)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (net(x) - y).pow(2).mean()


def _attempt() -> int:
    return int(os.environ.get("HORA_RESTART_COUNT", "0"))


def _shard(net: nn.Module, world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def train(plan: Plan) -> dict[str, Any]:
    import hora.torch as hvd

    _init(plan, hvd)
    attempt = _attempt()
    x, y = dataset(plan.samples)
    net = model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=plan.lr, momentum=0.9),
        named_parameters=net.named_parameters(),
    )
    state = hvd.elastic.TorchState(net, opt, epoch=0, **_state_extras(plan, hvd))
    sizes: list[int] = []
    state.register_reset_callbacks([sizes.append])

    @hvd.elastic.run
    def loop(state: hvd.elastic.TorchState) -> None:
        rank, world, generation = hvd.rank(), hvd.size(), _generation()
        log = _logger(Path(plan.folder, f"log-{attempt}-{generation}-{rank}.jsonl"))
        start = state.commit_index
        log(
            {
                "start": start,
                "epoch": state.epoch,
                "reset_sizes": list(sizes),
                "pid": os.getpid(),
                "at": time.time(),  # in its hvd.elastic.run, the state synced
            }
        )
        n = 0
        waited = False
        while state.epoch < plan.epochs:
            for j, (idx, xb, yb) in enumerate(_batches(state, plan, x, y)):
                _step(plan, state, xb, yb)
                log(
                    {
                        "n": n,
                        "world": world,
                        "epoch": state.epoch,
                        "commit": state.commit_index,
                        "idx": idx,
                        "t": time.time(),
                    }
                )
                n += 1
                if plan.data is None:
                    state.sampler.record_batch(j, plan.batch)
                _maybe_fault(plan, attempt, generation, rank, world, state.commit_index - start)
                time.sleep(plan.step_seconds)
                if (j + 1) % plan.commit_every == 0:
                    if plan.wait_for_return and world < plan.full and not waited:
                        waited = _wait_for_return(plan.folder, rank, plan)
                    state.commit()
            state.epoch += 1
            if plan.data is None:
                state.sampler.set_epoch(state.epoch)
            state.commit()
        if plan.end_fault and rank == world - 1 and _once(Path(plan.folder, END_KILLED_MARK)):
            os.kill(os.getpid(), signal.SIGKILL)  # trained to the end, not yet returned

    loop(state)
    weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
    result: dict[str, Any] = {
        "rank": hvd.rank(),
        "world": hvd.size(),
        "attempt": attempt,
        "weights": weights,
        "pid": os.getpid(),
    }
    if plan.fsdp:
        result["sharded"] = {
            k: v.full_tensor().detach().clone() for k, v in state.sharded.state_dict().items()
        }
        result["mesh"] = next(state.sharded.parameters()).device_mesh.size()
    result["host"] = socket.gethostname()
    return result


def _step(plan: Plan, state: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    """One step of the MLP (and first of its FSDP2 twin: a lost rank fails FSDP2's collectives
    first), its loss reported to hora with `plan.report`."""
    if plan.fsdp:
        state.sharded_opt.zero_grad()
        _loss(state.sharded, x, y).backward()
        state.sharded_opt.step()
    state.optimizer.zero_grad()
    loss = _loss(state.model, x, y)
    loss.backward()
    state.optimizer.step()
    if plan.report:
        import hora

        hora.report({"loss": loss.item()})


def _state_extras(plan: Plan, hvd: Any) -> dict[str, Any]:
    """The TorchState's sampler (or loader), and the FSDP2 copy with its optimizer."""
    extra: dict[str, Any] = {}
    if plan.data is None:
        extra["sampler"] = hvd.elastic.ElasticSampler(range(plan.samples), shuffle=True, seed=1)
    else:
        extra["loader"] = plan.data.loader(plan.batch, shuffle=True, seed=1)
    if plan.fsdp:
        extra |= _sharded(plan, hvd.size())
        extra["checkpoint_dir"] = os.path.join(plan.folder, "dcp")
        if plan.reshard:
            extra["reshard"] = lambda size: _sharded(plan, size)
    return extra


def _sharded(plan: Plan, world: int) -> dict[str, Any]:
    """The FSDP2 copy sharded over a world of `world`, and its optimizer."""
    sharded = _shard(model(), world)
    opt = torch.optim.SGD(sharded.parameters(), lr=plan.lr, momentum=0.9)
    return {"sharded": sharded, "sharded_opt": opt}


def _batches(
    state: Any, plan: Plan, x: torch.Tensor, y: torch.Tensor
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """What is left of this epoch for this rank: (sample indices, x, y) per step, from the
    sampler and the dataset in memory, or from the loader (the rows as hora.data read them)."""
    if plan.data is None:
        indices = list(state.sampler)
        for i in range(0, len(indices), plan.batch):
            idx = indices[i : i + plan.batch]
            yield idx, x[idx], y[idx]
        return
    state.loader.set_epoch(state.epoch)  # a resumed epoch keeps its position
    for batch in state.loader:
        yield batch["id"].tolist(), batch["x"], batch["y"]


def _logger(path: Path) -> Any:
    def log(entry: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    return log


def _generation() -> int:
    """Which world of the attempt this is: 0 its first, then one more per world re-formed in
    place (shrunk or grown; a rank that joined a grown world starts in it)."""
    return int(os.environ.get("HORA_WORLD_GENERATION") or 0)


def _maybe_fault(
    plan: Plan, attempt: int, generation: int, rank: int, world: int, commits: int
) -> None:
    """The fault, in the attempt's first world only (not again in one re-formed in place)."""
    if plan.fault is None or (attempt, generation) != (plan.fault_attempt, 0):
        return
    if rank not in (plan.fault_ranks or (world - 1,)):
        return
    if commits != plan.fault_commit:
        return
    if plan.fault in ("self", "actor"):
        Path(plan.folder, KILLED_MARK).write_text(repr(time.time()))
        os.kill(os.getpid() if plan.fault == "self" else os.getppid(), signal.SIGKILL)
        time.sleep(3600)  # an orphan of its actor: hora must stop it
    Path(plan.folder, HOST_MARK).write_text(socket.gethostname())
    time.sleep(3600)  # as a lost host: this rank trains no further


def _init(plan: Plan, hvd: Any) -> None:
    """hvd.init(), with the plan's faults of a rank of the first world or of the first rank
    started to grow the world."""
    first_world = not _generation() and int(os.environ["RANK"]) == plan.full - 1
    if plan.start_fault and first_world and _once(Path(plan.folder, START_KILLED_MARK)):
        os.kill(os.getpid(), signal.SIGKILL)
    first_joiner = _first_joiner(plan)
    if first_joiner and plan.joiner_fault == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    if first_joiner and plan.joiner_fault == "running":  # until a running rank is lost
        _wait_for(Path(plan.folder, RUNNING_KILLED_MARK))
    if plan.window_fault:
        _arm_window_fault(plan)
    if plan.run_fault:
        _arm_run_fault(plan)
    hvd.init()
    if first_joiner and plan.joiner_fault == "after_init":
        os.kill(os.getpid(), signal.SIGKILL)


def _arm_window_fault(plan: Plan) -> None:
    """`window_fault`: in the world of generation 1, its last rank dies "rendezvous": where hora
    tells the driver a world gathered (`say_formed`), between its presence barrier and torch's
    rendezvous; "tree": as it is about to join the negotiation tree, past torch's rendezvous
    (its parent waits for it there)."""
    from hora.collectives import _driver, _start

    def dies() -> None:
        last = int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1
        if _generation() == 1 and last and _once(Path(plan.folder, WINDOW_KILLED_MARK + ".once")):
            Path(plan.folder, WINDOW_KILLED_MARK).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    if plan.window_fault == "tree":
        join = _start._join_tree

        def joined_or_killed(*args: Any, **kwargs: Any) -> Any:
            dies()
            return join(*args, **kwargs)

        _start._join_tree = joined_or_killed
        return
    formed = _driver.say_formed

    def formed_or_killed(generation: int) -> None:
        dies()
        formed(generation)

    _driver.say_formed = formed_or_killed


def _arm_run_fault(plan: Plan) -> None:
    """`run_fault`: the world's last rank dies where its hvd.elastic.run would say it can
    re-form (past its resume: the others' loops have started, their first step waits for it)."""
    from hora.collectives import _driver

    say = _driver.announce_in_place

    def killed_or_said(able: bool, grows: bool = False) -> bool:
        last = int(os.environ["RANK"]) == plan.full - 1
        if not _generation() and last and _once(Path(plan.folder, RUN_KILLED_MARK)):
            for rank in range(plan.full - 1):  # every other rank said so, and is in its loop
                _wait_for(Path(plan.folder, f"log-{_attempt()}-0-{rank}.jsonl"))
            os.kill(os.getpid(), signal.SIGKILL)
        return say(able, grows)

    _driver.announce_in_place = killed_or_said


def _first_joiner(plan: Plan) -> bool:
    """Whether this process is the first one started to grow a world in place (it starts in a
    later world's generation); the mark is made once, by it alone."""
    if plan.joiner_fault is None or not _generation():
        return False
    return _once(Path(plan.folder, FIRST_JOINER_MARK))


def _once(mark: Path) -> bool:
    """True for the one process that makes `mark`."""
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def _maybe_running_fault(plan: Plan) -> None:
    """joiner_fault "running": rank 0 of a shrunk world, holding its commit until the run grows
    back, SIGKILLs itself once the first new rank has started (which waits for it)."""
    mark = Path(plan.folder, RUNNING_KILLED_MARK)
    if plan.joiner_fault != "running" or mark.exists():
        return
    if Path(plan.folder, FIRST_JOINER_MARK).exists():
        mark.write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


def _wait_for(path: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_for_return(folder: str, rank: int, plan: Plan | None = None) -> bool:
    """Rank 0 says the run is small, and holds the next commit until the test has brought the
    capacity back and the driver has said so (the other ranks wait in the commit's broadcast):
    the run grows at that commit, however long the capacity took to return."""
    from hora import elastic

    if rank == 0:
        Path(folder, SMALL_MARK).touch()
        while not (Path(folder, BACK_MARK).exists() and elastic.hosts_updated()):
            if plan is not None:
                _maybe_running_fault(plan)
            time.sleep(0.1)
    return True


# ----- reading the logs back ------------------------------------------------------------------
Life = tuple[int, int]  # (attempt, world re-formed in place within it: 0 for its first)


def read_logs(folder: str) -> dict[Life, dict[int, list[dict[str, Any]]]]:
    """(attempt, world within it) -> rank -> its log entries, in order."""
    logs: dict[Life, dict[int, list[dict[str, Any]]]] = defaultdict(dict)
    for path in Path(folder).glob("log-*.jsonl"):
        _, attempt, call, rank = path.stem.split("-")
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        logs[int(attempt), int(call)][int(rank)] = entries
    return dict(logs)


@dataclass(frozen=True)
class Step:
    """One step of the run as the model saw it: the world size and each rank's indices."""

    attempt: Life
    epoch: int
    world: int
    batches: tuple[tuple[int, ...], ...]  # by rank


def kept_steps(folder: str) -> tuple[list[Step], list[int], list[int]]:
    """The steps the final model contains, in order; each world's size (an attempt's, and each
    world re-formed in place within it); and the commit each started from."""
    logs = read_logs(folder)
    attempts = sorted(logs)
    starts = [logs[a][0][0]["start"] for a in attempts]
    worlds = []
    kept: list[Step] = []
    for position, a in enumerate(attempts):
        ranks = logs[a]
        world = len(ranks)
        worlds.append(world)
        resumed_at = starts[position + 1] if position + 1 < len(attempts) else None
        steps = [[e for e in ranks[r] if "n" in e] for r in range(world)]
        count = min(len(s) for s in steps)  # a killed rank may have logged one step fewer
        for n in range(count):
            entries = [steps[r][n] for r in range(world)]
            if resumed_at is not None and entries[0]["commit"] >= resumed_at:
                continue  # after the commit the next attempt resumed from: rolled back
            assert {e["world"] for e in entries} == {world}
            batches = tuple(tuple(e["idx"]) for e in entries)
            kept.append(Step(a, entries[0]["epoch"], world, batches))
    return kept, worlds, starts


def check_in_place(
    folder: str, results: list[dict[str, Any]], small: int
) -> dict[Life, dict[int, list[dict[str, Any]]]]:
    """One attempt whose first world shrank in place to `small` ranks and grew back in place:
    the survivors (ranks below `small`) kept their processes in all three worlds, the ranks
    that joined are new processes, and `results` come from the last world's ranks in order.
    Returns the logs (`read_logs`), for the caller's own checks."""
    logs = read_logs(folder)
    assert sorted(logs) == [(0, 0), (0, 1), (0, 2)], sorted(logs)  # one attempt, three worlds
    pids = {life: {r: e[0]["pid"] for r, e in ranks.items()} for life, ranks in logs.items()}
    kept = {r: pids[0, 0][r] for r in range(small)}
    assert {r: pids[0, 1][r] for r in range(small)} == kept, pids
    assert {r: pids[0, 2][r] for r in range(small)} == kept, pids
    full = len(pids[0, 2])
    joined = {pids[0, 2][r] for r in range(small, full)}
    assert len(joined) == full - small and not joined & {*pids[0, 0].values()}, pids  # new
    assert [r["pid"] for r in results] == [pids[0, 2][r] for r in range(full)]
    assert [r["world"] for r in results] == [full] * full
    return logs


def check_survivors(
    folder: str, results: list[dict[str, Any]], worlds: list[int]
) -> dict[Life, dict[int, list[dict[str, Any]]]]:
    """One attempt whose worlds, re-formed in place, had `worlds` ranks in turn: ranks below the
    smallest world kept their processes in every world (a rank that survives keeps its process
    and its order), and `results` come from the last world's ranks in order."""
    logs = read_logs(folder)
    lives = sorted(logs)
    assert {a for a, _ in lives} == {0}, lives  # one attempt: no restart
    assert [len(logs[life]) for life in lives] == worlds, lives
    pids = [{r: e[0]["pid"] for r, e in logs[life].items()} for life in lives]
    kept = {r: pids[0][r] for r in range(min(worlds))}
    for world in pids:
        assert {r: world[r] for r in kept} == kept, pids
    assert [r["pid"] for r in results] == [pids[-1][r] for r in range(worlds[-1])]
    return logs


def check_grew_in_place(err: str, small: int, full: int, commit: int) -> None:
    """The driver's lines for a growth in place from `small` to `full` ranks on the local
    engine, which went on from `commit`."""
    joined = ", ".join(str(r) for r in range(small, full))
    assert (
        f"hora: growing in place from {small} to {full} ranks (free slots for {full} ranks): "
        f"starting rank{'s' if full - small > 1 else ''} {joined}; the running ranks keep "
        "their processes"
    ) in err, err
    assert re.search(
        rf"hora: resized in place from {small} to {full} ranks in [0-9.]+ s \(free slots for "
        rf"{full} ranks\); the ranks went on from commit {commit}",
        err,
    ), err
    assert re.search(
        rf"hora: growth from {small} to {full} ranks: the new ranks' start \(process, imports, "
        r"init\) [0-9.]+ s, then the running ranks' way to their next commit and the sync "
        r"[0-9.]+ s",
        err,
    ), err


def check_trained_once(
    plan: Plan, results: list[dict[str, Any]], atol: float
) -> tuple[list[Step], list[int]]:
    """Every sample of every epoch trained once in the final model, and every rank's weights
    those of one process on the same steps (to `atol`). Returns the kept steps and each world's
    size (`kept_steps`)."""
    steps, worlds, _ = kept_steps(plan.folder)
    epochs = samples_per_epoch(steps)
    assert epochs == {e: list(range(plan.samples)) for e in range(plan.epochs)}, epochs
    want = reference(plan, steps)
    for r in results:
        for key, value in want.items():
            torch.testing.assert_close(r["weights"][key], value, rtol=0, atol=atol)
    return steps, worlds


def samples_per_epoch(steps: list[Step]) -> dict[int, list[int]]:
    """epoch -> every sample index trained in it, sorted (repeats kept)."""
    seen: dict[int, list[int]] = defaultdict(list)
    for step in steps:
        for batch in step.batches:
            seen[step.epoch].extend(batch)
    return {epoch: sorted(indices) for epoch, indices in seen.items()}


def reference(plan: Plan, steps: list[Step]) -> dict[str, torch.Tensor]:
    """`steps` in one process: each on every rank's batch at once (the ranks' batches are the
    same size, so the mean loss over all of them averages the ranks' gradients)."""
    x, y = dataset(plan.samples)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=plan.lr, momentum=0.9)
    for step in steps:
        idx = [i for batch in step.batches for i in batch]
        opt.zero_grad()
        _loss(net, x[idx], y[idx]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
