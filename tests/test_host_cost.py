"""benchmarks/host_cost.py's counting machinery: callgrind's dumps read right, and its client requests
counting exactly the code between them (under valgrind, where installed) and doing nothing without it."""

import importlib.util
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("host_cost", ROOT / "benchmarks" / "host_cost.py")
host_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_cost)

X86 = platform.machine().lower() in ("x86_64", "amd64")

# callgrind's format with its name compression: "(id) name" the first time, "(id)" after; a cost line
# after "calls=" is the inclusive cost of those calls, every other one the function's own
DUMP = """\
version: 1
creator: callgrind-3.19.0
pid: 1
cmd:  python
part: 2

desc: Trigger: Client Request: prefill | flash | global | 0

positions: line
events: Ir
summary: 1025
fl=(1) a.c
fn=(1) outer
10 100
cfl=(1)
cfn=(2) inner
calls=3 20
+2 900
fn=(2)
20 850
cfn=(3) leaf
calls=1 30
* 50
fn=(3)
30 50
fn=(1)
12 25
totals: 1025
"""


def test_read_dump_gives_self_and_inclusive_costs_calls_and_the_label(tmp_path):
    path = tmp_path / "cg.out.1.2"
    path.write_text(DUMP)
    d = host_cost.read_dump(str(path))
    assert d["label"] == "prefill | flash | global | 0"
    assert d["total"] == 1025
    assert d["self"] == {"outer": 125, "inner": 850, "leaf": 50}
    assert sum(d["self"].values()) == d["total"]
    assert d["incl"] == {"inner": 900, "leaf": 50}  # what the calls into each cost
    assert d["calls"] == {"inner": 3, "leaf": 1}


@pytest.mark.skipif(not X86, reason="the client requests are written for x86-64")
def test_client_requests_do_nothing_natively():
    cg = host_cost.ClientRequests()
    assert not cg.on_valgrind()
    assert cg.request(cg.TOGGLE) == 0  # the magic sequence is a no-op without valgrind
    cg.dump("nothing")


COUNTED = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("host_cost", sys.argv[1])
    hc = importlib.util.module_from_spec(spec); spec.loader.exec_module(hc)
    cg = hc.ClientRequests()
    assert cg.on_valgrind()
    def work(n):
        s = 0
        for i in range(n):
            s += i
    work(50000)  # not counted: collection is off outside the requests
    for n in (0, 5000, 10000):
        cg.request(cg.ZERO)
        cg.request(cg.TOGGLE)
        work(n)
        cg.request(cg.TOGGLE)
        work(20000)  # not counted either
        cg.dump(f"work {n}")
""")


@pytest.mark.skipif(not X86 or shutil.which("valgrind") is None, reason="needs valgrind on x86-64")
def test_callgrind_counts_only_what_runs_between_the_requests(tmp_path):
    script = tmp_path / "counted.py"
    script.write_text(COUNTED)
    subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                    f"--callgrind-out-file={tmp_path}/cg.out.%p", sys.executable, str(script),
                    str(ROOT / "benchmarks" / "host_cost.py")], check=True, capture_output=True, timeout=300)
    dumps = [host_cost.read_dump(str(p)) for p in tmp_path.glob("cg.out.*")]
    totals = {d["label"]: d["total"] for d in dumps if d["label"]}
    empty, one, two = totals["work 0"], totals["work 5000"], totals["work 10000"]
    assert empty < 20000  # the requests themselves and the empty call: no loop outside them counted
    loop = one - empty
    assert loop > 5000 * 10  # a Python loop iteration is tens of instructions
    assert abs((two - empty) - 2 * loop) < 0.03 * loop  # twice the loop, twice the count (within allocation noise)


def test_a_steps_figures_add_each_call_its_share_of_the_context_over_sdpa_kernels():
    res = {"rows": [{"scope": "global", "added_instr_per_call": 100.0},
                    {"scope": "model-scoped", "added_instr_per_call": 50.0}],
           "enter_exit": {"sdpa_kernel([FLASH])": {"instr": 1000.0}, "flash | global": {"instr": 2600.0},
                          "flash | model-scoped": {"instr": 1800.0}},
           "instructions_per_us": {"used": 500.0}}
    host_cost.step_figures(res, 16)
    assert [r["step_added_instr_per_call"] for r in res["rows"]] == [200.0, 100.0]
    assert [r["step_added_us_approx"] for r in res["rows"]] == [0.4, 0.2]
