"""``ringtree perf`` flag parsing: nccl-tests' getopt flags, size suffixes, ``all``."""

from __future__ import annotations

import io

import pytest

from ringtree.dtypes import DType
from ringtree.perf import cli, console, spawn
from ringtree.perf.flags import Options, UsageError, parse_args, parse_size, sizes


@pytest.mark.parametrize("text,value", [
    ("8", 8), ("0", 0), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("2G", 2 << 30),
    ("1.5M", 1572864), ("64MB", 64 << 20), ("4 K", 4096), ("1e3", 1000),
])
def test_size_suffixes(text, value):
    assert parse_size(text, "minbytes") == value


@pytest.mark.parametrize("text", ["1X", "abc", "", "-5", "1B"])
def test_bad_sizes(text):
    with pytest.raises(UsageError, match="invalid size specified for 'minbytes'"):
        parse_size(text, "minbytes")


def test_defaults_are_nccl_tests():
    o = parse_args(["all_reduce"])
    assert (o.min_bytes, o.max_bytes, o.step_bytes, o.step_factor) == (32 << 20, 32 << 20,
                                                                       1 << 20, 1)
    assert (o.iters, o.warmup, o.agg, o.cycles, o.check) == (0, 1, 1, 1, 1)
    assert (o.ops, o.dtypes, o.root, o.blocking, o.average) == (["sum"], [DType.FLOAT32], 0,
                                                                0, 1)
    assert (o.timeout, o.cputime, o.timestamps, o.json, o.backend) == (0, 0, 0, None,
                                                                       "ringtree")


def test_short_long_and_attached_forms():
    a = parse_args(["all_reduce", "-b", "8", "-e", "64M", "-f", "4", "-c", "1", "-n", "5"])
    b = parse_args(["all_reduce", "-b8", "-e64M", "-f4", "-c1", "-n5"])
    c = parse_args(["--minbytes=8", "--maxbytes", "64M", "--stepfactor", "4", "--check=1",
                    "--iters", "5", "all_reduce"])
    for o in (a, b, c):
        assert (o.min_bytes, o.max_bytes, o.step_factor, o.check, o.iters) == (8, 64 << 20,
                                                                               4, 1, 5)


def test_integers_accept_c_bases():
    assert parse_args(["all_reduce", "-n", "0x10"]).iters == 16


def test_all_for_ops_types_roots():
    o = parse_args(["reduce", "-o", "all", "-d", "all", "-r", "all"])
    assert o.ops == ["sum", "prod", "max", "min", "avg", "mulsum"]  # nccl-tests order
    assert [d.nccl_name for d in o.dtypes] == ["int8", "uint8", "int32", "uint32", "int64",
                                               "uint64", "half", "float", "double",
                                               "bfloat16"]
    assert o.root == -1


@pytest.mark.parametrize("name,dt", [("float", DType.FLOAT32), ("half", DType.FLOAT16),
                                     ("double", DType.FLOAT64), ("bfloat16", DType.BFLOAT16),
                                     ("int8", DType.INT8), ("uint64", DType.UINT64),
                                     ("float32", DType.FLOAT32)])
def test_type_names(name, dt):
    assert parse_args(["all_reduce", "-d", name]).dtypes == [dt]


@pytest.mark.parametrize("name,op", [("sum", "sum"), ("PROD", "prod"), ("mulsum", "mulsum"),
                                     ("premul_sum", "mulsum"), ("avg", "avg")])
def test_op_names(name, op):
    assert parse_args(["all_reduce", "-o", name]).ops == [op]


@pytest.mark.parametrize("argv,msg", [
    (["all_reduce", "-o", "xor"], "invalid op"),
    (["all_reduce", "-d", "f8e4m3"], "invalid type"),
    (["all_reduce", "-b", "1M", "-e", "1K"], "invalid sizes"),
    (["all_reduce", "-t", "2"], "one rank per process"),
    (["all_reduce", "-G", "1"], "CUDA graphs"),
    (["all_reduce", "-a", "4"], "-a must be"),
    (["all_reduce", "-z", "5"], "-z must be"),
    (["all_reduce", "--backend", "nccl"], "--backend must be"),
    (["all_reduce", "-n", "ten"], "invalid value"),
    (["all_reduce", "--bogus"], "invalid option"),
    (["frobnicate"], "unknown collective"),
    ([], "which collective"),
])
def test_usage_errors(argv, msg):
    with pytest.raises(UsageError, match=msg):
        parse_args(argv)


def test_ringtree_flags():
    o = parse_args(["all_reduce", "--backend", "gloo", "--nranks", "4", "--plot", "x.png",
                    "--no-progress", "-J", "r.json"])
    assert (o.backend, o.nranks, o.plot, o.progress, o.json) == ("gloo", 4, "x.png", False,
                                                                 "r.json")
    o = parse_args(["broadcast", "--algo", "tree", "--transport", "tcp", "--progress"])
    assert (o.coll, o.algo, o.transport, o.progress) == ("broadcast", "tree", "tcp", True)


def test_sweeps():
    assert list(sizes(Options(min_bytes=8, max_bytes=64 << 20, step_factor=4)))[-1] == 32 << 20
    assert list(sizes(Options(min_bytes=8, max_bytes=128, step_factor=2))) == \
        [8, 16, 32, 64, 128]
    assert list(sizes(Options(min_bytes=1000, max_bytes=3500, step_bytes=1000))) == \
        [1000, 2000, 3000]
    assert list(sizes(Options(min_bytes=0, max_bytes=4, step_factor=2))) == [0, 1, 2, 4]
    assert list(sizes(Options(min_bytes=5, max_bytes=5))) == [5]


def test_strip_nranks():
    assert spawn._strip_nranks(["all_reduce", "--nranks", "4", "-b", "8", "--nranks=2"]) == \
        ["all_reduce", "-b", "8"]


def test_main_exit_codes(capsys):
    assert cli.main(["all_reduce", "-h"]) == 0
    assert "USAGE: ringtree perf all_reduce" in capsys.readouterr().out
    assert cli.main(["all_reduce", "-b", "1Q"]) == 2
    assert "invalid size" in capsys.readouterr().err
    assert cli.main([]) == 2


def test_builtin_progress_bar(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name == "tqdm":
            raise ImportError("no tqdm here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    out = io.StringIO()
    bar = console.Progress(4, "all_reduce_perf", out, delay=0.0)
    bar.update()
    bar.update()
    text = out.getvalue()
    assert "2/4" in text and "all_reduce_perf" in text and "\r" in text
    bar.clear()
    assert out.getvalue().endswith("\r\033[K")
    bar.close()


def test_printer_writes_whole_lines_only():
    out = io.StringIO()
    p = console.Printer(True, out)
    p.write("  8  2")
    assert out.getvalue() == ""
    p.write("  rest\n")
    assert out.getvalue() == "  8  2  rest\n"
    quiet = console.Printer(False, out)
    quiet.line("not rank 0")
    assert "not rank 0" not in out.getvalue()
