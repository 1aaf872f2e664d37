"""The training core past one process: two gloo processes started by ``torchrun`` keep identical
parameters after every step, match one process training on the concatenated batch and reduce
their evaluations into the whole held-out set's metric; a run interrupted and resumed from its
checkpoint reproduces the uninterrupted run bit for bit (CPU, one thread)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

from demos import train_detr as T  # noqa: E402
from vispos.app.train.cli import run  # noqa: E402

STEPS = 3
#: every image padded to 64 x 64 (scales <= 64, size divisibility 64) and the backbone's batch norm
#: frozen (DETR), so a process's half batch is exactly its part of the whole batch
TINY = ["--tiny", "--pos", "sine", "--scales", "48", "64", "--size-divisibility", "64", "--norm", "frozen",
        "--eval-images", "6", "--eval-every", str(STEPS), "--threads", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(model) -> torch.Tensor:
    net = model.module if hasattr(model, "module") else model
    return torch.cat([p.detach().reshape(-1).clone() for p in net.parameters()])


def _torchrun_worker(out: str, result: str) -> None:
    """What each of torchrun's processes runs (``__main__`` below): the demo's own ``run`` (what
    ``python -m demos.train_detr`` calls), recording the parameters after every step and the sizes
    of the held-out shares each evaluation gathers."""
    from vispos.app.train.distributed import DistContext

    seen, gathered = [], []
    gather = DistContext.all_gather_object

    def spy(self, obj):
        parts = gather(self, obj)
        gathered.append([len(p) for p in parts])
        return parts

    DistContext.all_gather_object = spy
    run(T.TASK, [*TINY, "--steps", str(STEPS), "--batch-size", "2", "--out", out],
        on_step=lambda step, model: seen.append(_params(model)))
    torch.save({"params": seen, "gathered": gathered}, f"{result}.{os.environ['RANK']}")


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process_on_the_whole_batch(tmp_path):
    """``torchrun --nproc_per_node 2`` (gloo): parameters identical across ranks after every step and
    equal to one process training on the concatenated batch; rank 0 alone logs and writes
    metrics.json (world size 2, global batch 4); each evaluation scores each process's share and
    reduces them into the metric of the whole held-out set."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           os.path.abspath(__file__), str(tmp_path / "ddp"), str(tmp_path / "params")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(f"[sine] step {STEPS}/{STEPS}") == 1  # rank 0 alone logs
    ranks = [torch.load(tmp_path / f"params.{r}", weights_only=True) for r in range(2)]
    assert len(ranks[0]["params"]) == len(ranks[1]["params"]) == STEPS
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)  # identical across ranks after every step
    # one evaluation (at the last step) in two compositions (batches of 2 per process, then one item at a
    # time): 6 held-out items, 3 scored by each process, all 6 gathered, in each
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == [[3, 3], [3, 3]]
    single = []
    threads = torch.get_num_threads()
    try:
        run(T.TASK, [*TINY, "--steps", str(STEPS), "--batch-size", "4", "--out", str(tmp_path / "one")],
            log=lambda *_: None, on_step=lambda step, model: single.append(_params(model)))
    finally:
        torch.set_num_threads(threads)
    assert not torch.equal(single[0], single[-1])  # it trained
    for step, (a, b) in enumerate(zip(ranks[0]["params"], single), start=1):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"step {step}")
    m2 = json.loads((tmp_path / "ddp" / "sine" / "seed0" / "metrics.json").read_text())
    m1 = json.loads((tmp_path / "one" / "sine" / "seed0" / "metrics.json").read_text())
    assert (m2["world_size"], m2["global_batch"], m1["world_size"], m1["global_batch"]) == (2, 4, 1, 4)
    assert m2["steps"] == m1["steps"] == list(range(1, STEPS + 1))
    for key in ("loss", "loss_ce", "loss_l1", "loss_giou", "padded_fraction"):
        torch.testing.assert_close(torch.tensor(m2[key]), torch.tensor(m1[key]), rtol=1e-4, atol=1e-5, msg=key)
    # evaluation: each process scored its share, the metric saw the whole held-out set
    for key in ("mean_iou", "map", "ap50", "ap75"):
        assert m2["eval"][-1][key] == pytest.approx(m1["eval"][-1][key], abs=1e-3), key
        # one item at a time: the same items, alone, in both
        assert m2["eval_by_composition"]["batch1"][-1][key] == pytest.approx(
            m1["eval_by_composition"]["batch1"][-1][key], abs=1e-3), key
    assert (m2["eval_compositions"], m1["eval_compositions"]) == (["batch2", "batch1"], ["batch4", "batch1"])
    assert (tmp_path / "ddp" / "ablation.md").exists()


def test_interrupted_and_resumed_run_is_bit_exact(tmp_path):
    """Six steps in one go against three, an interruption at step 5 (the step-3 checkpoint survives)
    and a resumption: the final checkpoints are equal as wholes (model, optimizer moments and step
    counts, scheduler, every RNG state, the sampler's epoch and position, the step) and so are the
    metrics (every loss, learning rate and evaluation)."""
    # 4 training images of batch 2: epochs of 2 steps, so step 3's checkpoint is mid-epoch (the
    # sampler's set_epoch and the skip into the epoch both matter); batch norm trained (its running
    # statistics are part of the state); dropout draws from torch's global RNG, so the RNG state
    # must be restored too
    args = [*TINY, "--norm", "batch", "--dropout", "0.1", "--steps", "6", "--save-every", "3", "--eval-every", "2", "--train-images", "4"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run(T.TASK, [*args, "--out", str(tmp_path / "full")], log=lambda *_: None)

        def interrupt(step, model):
            if step == 5:
                raise KeyboardInterrupt  # after the checkpoint of step 3, before the one of step 6

        with pytest.raises(KeyboardInterrupt):
            run(T.TASK, [*args, "--out", str(tmp_path / "cut")], log=lambda *_: None, on_step=interrupt)
        ckpt = tmp_path / "cut" / "sine" / "seed0" / "checkpoint.pt"
        mid = torch.load(ckpt, weights_only=True)
        assert mid["step"] == 3 and mid["sampler"] == {"epoch": 1, "skip": 2, "seed": 0}
        assert not (tmp_path / "cut" / "sine" / "seed0" / "metrics.json").exists()
        logs = []
        run(T.TASK, [*args, "--out", str(tmp_path / "cut"), "--resume", str(ckpt)], log=logs.append)
    finally:
        torch.set_num_threads(threads)
    assert any("resumed from" in line and "at step 3" in line for line in logs)
    full = torch.load(tmp_path / "full" / "sine" / "seed0" / "checkpoint.pt", weights_only=True)
    resumed = torch.load(ckpt, weights_only=True)
    assert set(full) == set(resumed)
    assert full["step"] == resumed["step"] == 6 and full["sampler"] == resumed["sampler"] == {"epoch": 3, "skip": 0, "seed": 0}
    assert any(k.endswith("running_mean") for k in full["model"])
    for part in ("model", "optimizer", "scheduler"):
        torch.testing.assert_close(resumed[part], full[part], rtol=0, atol=0, msg=lambda m, part=part: f"{part}: {m}")
    assert full["optimizer"]["state"] and full["scheduler"]["last_epoch"] == 6
    (rf,), (rr,) = full["rng"], resumed["rng"]
    assert torch.equal(rf["torch"], rr["torch"]) and rf["numpy"] == rr["numpy"] and rf["python"] == rr["python"]
    assert not torch.equal(rf["torch"], mid["rng"][0]["torch"])  # dropout drew from it between the checkpoints
    written = json.loads((tmp_path / "cut" / "sine" / "seed0" / "metrics.json").read_text())
    for m in (full["metrics"], resumed["metrics"], written):  # wall time, memory, paths: not the training
        m.pop("seconds"), m.pop("rss_mb"), m.pop("args")
    assert resumed["metrics"].pop("resumed_at") == written.pop("resumed_at") == [3]
    assert full["metrics"].pop("resumed_at") == []
    assert resumed["metrics"] == full["metrics"] == written  # every loss, learning rate and evaluation, exactly
    assert len(full["metrics"]["eval"]) == 3 and full["metrics"]["steps"] == [1, 2, 3, 4, 5, 6]
    assert {k: v for k, v in full["args"].items() if k != "out"} == {
        k: v for k, v in resumed["args"].items() if k not in ("out", "resume")} | {"resume": None}


def test_resume_refuses_another_arm_or_other_settings(tmp_path, capsys):
    """The command line refuses before any work (exit 2, one line; more in tests/test_train_detr.py);
    ``train_arm`` called directly refuses with a ValueError saying the same."""
    from vispos.app.train import DistContext, train_arm
    from vispos.app.train.cli import parse_args

    run(T.TASK, [*TINY, "--steps", "2", "--save-every", "2", "--out", str(tmp_path)], log=lambda *_: None)
    ckpt = str(tmp_path / "sine" / "seed0" / "checkpoint.pt")
    for extra, message in [
        (["--pos", "grid"], "argument --resume: the checkpoint is of arm 'sine', this run trains 'grid'"),
        (["--lr", "2e-3"], "argument --resume: the settings differ from the checkpoint's: --lr (checkpoint 0.001, given 0.002)"),
        (["--pos", "sine", "grid"], "argument --resume: resumes one arm"),
    ]:
        with pytest.raises(SystemExit) as exc:
            run(T.TASK, [*TINY, "--steps", "2", "--out", str(tmp_path), *extra, "--resume", ckpt])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    _, args = parse_args(T.TASK, [*TINY, "--steps", "2", "--out", str(tmp_path), "--resume", ckpt])
    args.lr = 2e-3
    with pytest.raises(ValueError, match=r"--resume: the settings differ from the checkpoint's: --lr \(checkpoint 0.001, given 0.002\)"):
        train_arm(T.TASK, "sine", args, DistContext(), str(tmp_path / "direct"))


if __name__ == "__main__":  # under torchrun, from the test above
    _torchrun_worker(sys.argv[1], sys.argv[2])
