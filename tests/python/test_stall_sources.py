"""tools/stall_sources.py on a small source page: barrier waits charged to the barrier before."""

import importlib.util
import pathlib

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "stall_sources.py"
spec = importlib.util.spec_from_file_location("stall_sources", TOOL)
stall_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stall_sources)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_barrier",
          "stall_long_sb", "stall_barrier (Not Issued)"]
# (address, instruction, all samples, barrier, long_sb): the warps wait at the bar.sync at 0x20
# and the wgmma wait at 0x50, counted on the instructions after them
ROWS = [
    ("0x1000", "LDS R1, [R2]", 5, 0, 5),
    ("0x1010", "BAR.ARV 0x7, 0x200", 1, 0, 0),
    ("0x1020", "BAR.SYNC.DEFER_BLOCKING 0xb, 0x200", 2, 0, 0),
    ("0x1030", "@P6 BRA 0x1000", 90, 90, 0),
    ("0x1040", "FADD R1, R1, R2", 7, 3, 0),
    ("0x1050", "WARPGROUP.DEPBAR.LE gsb0, 0x0", 1, 0, 0),
    ("0x1060", "FMUL R1, R1, R2", 40, 40, 0),
]


def write_page(path, name="k_kernel(Params)"):
    lines = [f'"Kernel Name","{name}"', ",".join(f'"{h}"' for h in HEADER)]
    for addr, sass, n, bar, lsb in ROWS:
        lines.append(",".join(f'"{x}"' for x in (addr, sass, n, bar, lsb, bar)))
    path.write_text("\n".join(lines) + "\n")


def test_barrier_waits_are_charged_to_the_barrier_before(tmp_path, capsys):
    page = tmp_path / "page.csv"
    write_page(page)
    [(name, header, rows)] = stall_sources.kernels(page)
    assert name == "k_kernel(Params)" and len(rows) == len(ROWS)
    stall_sources.report(name, header, rows, top=10)
    out = capsys.readouterr().out
    waits = out.split("barrier waits")[1].splitlines()[1:]
    assert waits[0].split()[:2] == ["0x00020", "93"]  # the bar.sync: 90 + 3 samples after it
    assert waits[1].split()[:2] == ["0x00050", "40"]  # the wgmma wait
    assert "146 samples" in out


def test_a_kernel_name_that_matches_nothing_is_reported(tmp_path, monkeypatch):
    page = tmp_path / "page.csv"
    write_page(page)
    monkeypatch.setattr("sys.argv", ["stall_sources.py", str(page), "--kernel", "walk_a_bwd"])
    try:
        stall_sources.main()
    except SystemExit as e:
        assert "no kernel matching 'walk_a_bwd'" in str(e)
    else:
        raise AssertionError("expected an exit")
