"""The device check fits its window: read from the scripts themselves, every bounded step at its
limit adds up to at most 8 minutes, the parts' own time-outs sum below the cap the shell gives
them, and the parts run cheapest evidence first (a, c, b)."""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from support.paths import REPO

WINDOW_S = 8 * 60
SH = (REPO / "benchmarks" / "device_check.sh").read_text()
ENV_SH = (REPO / "benchmarks" / "device_check_env.sh").read_text()


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("device_check",
                                                  REPO / "benchmarks" / "device_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _function(text: str, name: str) -> str:
    start = text.index(f"{name}() {{")
    return text[start:text.index("\n}\n", start)]


def test_whole_check_within_eight_minutes() -> None:
    cap_s = int(re.search(r"^CAP_S=(\d+)", SH, re.M).group(1))  # type: ignore[union-attr]
    probe = _function(ENV_SH, "dc_probe")
    assert probe.count(") &") == 5 and "wait" in probe  # the five probes run at once
    probe_s = max(int(n) for n in re.findall(r"timeout (\d+)", probe)) + 1
    quick = [int(n) for n in re.findall(r"dc_t (\d+)", SH)]  # python checks in the shell
    steps = {name: [int(n) for n in re.findall(r"dc_t (\d+)", _function(ENV_SH, name))]
             for name in ("dc_install_carry", "dc_mpi_ok", "dc_mpi_fallback")}
    kill = re.search(r"timeout -k (\d+) \$\(\(cap \+ (\d+)\)\)", SH)
    assert kill is not None and len(quick) == 3 and all(steps.values())
    total = (probe_s + sum(quick) + sum(sum(v) for v in steps.values())
             + cap_s + int(kill.group(2)) + int(kill.group(1)))
    assert probe_s <= 10
    assert total <= WINDOW_S, total


def test_parts_fit_their_cap_and_run_a_c_b() -> None:
    mod = _module()
    cap_s = int(re.search(r"^CAP_S=(\d+)", SH, re.M).group(1))  # type: ignore[union-attr]
    assert sum(mod.BUDGET_S.values()) < cap_s
    assert mod.PART_ORDER == ("a", "c", "b")
    assert mod.main(["--cap-s", str(sum(mod.BUDGET_S.values())), "--out", "/nonexistent"]) == 2


def _tokens(command: str) -> list[str]:
    return command.replace("\\\n", " ").replace("#", " ").split()


def test_header_names_the_command_the_script_runs() -> None:
    fetch = _function(ENV_SH, "dc_fetch_carry")
    ran = fetch[fetch.index('"$DC_PY" -m pip download'):]
    ran = ran[:ran.index('-d "$wheels"') + len('-d "$wheels"')]
    ran = (ran.replace('"$DC_PY"', "python3").replace('"$DC_CARRY_LIST"',
           "benchmarks/device_check_carry.txt").replace('"$wheels"', ".carry/wheels"))
    told = SH[SH.index("#   python3 -m pip download"):SH.index("-d .carry/wheels") +
              len("-d .carry/wheels")]
    assert _tokens(told) == _tokens(ran)
    assert "bash benchmarks/device_check.sh --fetch-carry" in SH
