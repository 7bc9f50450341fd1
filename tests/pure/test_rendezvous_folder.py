"""The rendezvous store folder's rules (pure: files only, no process, no socket): what counts as
a private folder, where one is made, and the folder ``nereus run`` makes and removes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nereus.commands.run import store_folder
from nereus.errors import CommunicationError, ConfigError
from nereus.runtime.mpi.rendezvous import FOLDER_PREFIX, StoreFolder, new_folder, private_problem

ELSEWHERE = "192.0.2.7"  # TEST-NET-1: resolves to itself, never this host


def test_a_private_folder_is_a_real_0700_directory_of_this_user(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    assert private_problem(str(good)) == ""
    for mode in (0o750, 0o705, 0o777):
        good.chmod(mode)
        assert f"mode {mode:04o}" in private_problem(str(good))
    good.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(good)
    assert "not a directory" in private_problem(str(link))
    file = tmp_path / "file"
    file.write_text("x")
    assert "not a directory" in private_problem(str(file))
    assert "folder they share" in private_problem(str(tmp_path / "missing"))
    if os.geteuid() == 0:  # as root: a folder of another user
        os.chown(good, 12345, -1)
        assert "uid 12345" in private_problem(str(good))


def test_new_folders_go_to_tmpdir_on_one_host_and_beside_the_log_across_hosts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "logs").mkdir()
    local = Path(new_folder(False, str(tmp_path / "logs")))
    assert local.parent == tmp_path / "tmp" and local.name.startswith(FOLDER_PREFIX)
    shared = Path(new_folder(True, str(tmp_path / "logs")))
    assert shared.parent == tmp_path / "logs" and shared.name.startswith(f".{FOLDER_PREFIX}")
    for made in (local, shared):
        assert private_problem(str(made)) == ""
    with pytest.raises(CommunicationError, match="span hosts"):
        new_folder(True, "")
    f = StoreFolder(str(local), owned=False)
    f.remove()
    assert local.exists()  # the launcher's folder is the launcher's to remove
    StoreFolder(str(local), owned=True).remove()
    assert not local.exists()


def test_nereus_run_makes_its_folder_and_removes_it(tmp_path: Path) -> None:
    tmp = tmp_path / "run-tmp"
    tmp.mkdir(mode=0o700)
    (tmp_path / "logs").mkdir()
    log = str(tmp_path / "logs" / "run.h5")
    with store_folder((), log, str(tmp)) as folder:  # every rank on this host
        assert Path(folder).parent == tmp and private_problem(folder) == ""
    with store_folder(("localhost", "localhost"), log, str(tmp)) as folder:
        assert Path(folder).parent == tmp
    with store_folder((ELSEWHERE, "localhost"), log, str(tmp)) as folder:  # across hosts
        assert Path(folder).parent == tmp_path / "logs" and private_problem(folder) == ""
        (Path(folder) / "store-g0-x").write_text("")
    assert not Path(folder).exists()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == []
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "logs").chmod(0o500)
        with pytest.raises(ConfigError, match="--log"), \
                store_folder((ELSEWHERE,), log, str(tmp)):
            pass
