"""Collector outputs of a bundled server: one folder per harness process, so two lanes that serve
the same experiment, system and model at once (one server folder) never share trace files."""

import os

from harness.run import _collect_profile
from harness.servers import server_profile_dir


def test_each_harness_process_collects_only_its_own_profile(tmp_path):
    server_dir = tmp_path / "fig11b" / ".server-adaptive_hisparse-dsv41_mini"
    mine = server_profile_dir(server_dir)
    assert mine.parent == server_dir and str(os.getpid()) in mine.name
    other = server_dir / "profile-999999999"  # another lane's harness, still profiling
    for d, tag in ((mine, "mine"), (other, "other")):
        (d / "kernels").mkdir(parents=True)
        (d / "kernels" / "kernel_summary.json").write_text(tag)
    run = tmp_path / "fig11b" / "run-c16"
    run.mkdir(parents=True)
    _collect_profile(server_dir, [run])
    assert (run / "kernels" / "kernel_summary.json").read_text() == "mine"
    assert not mine.exists()
    assert (other / "kernels" / "kernel_summary.json").read_text() == "other"


def test_a_profile_schedule_inside_the_warmup_is_flagged(capsys):
    """profile=kernels with warm-up requests longer than profile.wait: a warning before the run
    (its profile would be of batch 1); none once the wait clears them or without a warm-up."""
    from omegaconf import OmegaConf

    from harness.run import warn_profile_in_warmup

    def cfg(warmup, wait, name="kernels", prefixes=None, concurrency=1):
        return OmegaConf.create(
            {
                "profile": {"name": name, "wait": wait},
                "workload": {"warmup": warmup, "output_len": 320, "prefixes": prefixes,
                             "concurrency": [concurrency]},
            }
        )  # fmt: skip

    assert warn_profile_in_warmup(cfg(1, 80)) and "warm-up" in capsys.readouterr().out
    assert not warn_profile_in_warmup(cfg(1, 400))
    assert not warn_profile_in_warmup(cfg(0, 80))
    assert not warn_profile_in_warmup(cfg(1, 80, name="none"))
    # one warm-up request per shared prefix, four at a time: 4 x 320 steps
    assert warn_profile_in_warmup(cfg(1, 1200, prefixes=16, concurrency=4))
    assert not warn_profile_in_warmup(cfg(1, 1300, prefixes=16, concurrency=4))
