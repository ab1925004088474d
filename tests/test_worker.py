"""`autotune worker`: a second process joins a study with the settings stored in it, and a machine that
differs from the study's is refused unless allowed (then recorded)."""

from __future__ import annotations

import optuna
from conftest import load_study, write_space


def test_a_worker_joins_with_the_study_settings_and_a_different_machine_is_refused(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[2, 4])
    created = searcher.search(space=space, trials=1)
    assert created.returncode == 0, created.stderr
    joined = searcher("join", "--study", "s", "--trials", "2", "--budget", "3m")  # nothing re-typed
    assert joined.returncode == 0, joined.stderr
    assert "resuming study 's'" in joined.stdout
    study = load_study(workdir, "s")
    assert len(study.trials) == 3 and all(t.user_attrs.get("host") for t in study.trials)
    assert {t.user_attrs["config"]["batch_size"] for t in study.trials} <= {2, 4}  # the stored space, not a default one

    fingerprint = study.user_attrs["fingerprint"]
    fingerprint["hardware"]["cpu_model"] = "Another CPU"
    study.set_user_attr("fingerprint", fingerprint)  # as if a different kind of machine had created it
    refused = searcher("worker", "--study", "s", "--trials", "1")  # the old name still works
    assert "'autotune worker' is now 'autotune join'" in refused.stdout
    assert refused.returncode == 2 and "differs from the one that created study 's'" in refused.stderr
    assert "cpu_model 'Another CPU'" in refused.stderr and "--allow-mixed-hardware" in refused.stderr
    assert len(load_study(workdir, "s").trials) == 3
    allowed = searcher("join", "--study", "s", "--trials", "1", "--allow-mixed-hardware")
    assert allowed.returncode == 0, allowed.stderr
    last = load_study(workdir, "s").trials[-1]
    assert any("cpu_model" in line for line in last.user_attrs["mixed_hardware"])


def test_joining_a_study_that_does_not_exist_is_one_line(cli, workdir):
    optuna.create_study(study_name="plain", storage=f"sqlite:///{workdir / 'plain.db'}")
    missing = cli("join", "--study", "nothing")
    assert missing.returncode == 2 and "no study 'nothing'" in missing.stderr
    foreign = cli("join", "--study", "plain", "--storage", f"sqlite:///{workdir / 'plain.db'}")
    assert foreign.returncode == 2 and "not created by 'autotune search'" in foreign.stderr
