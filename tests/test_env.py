"""Tests of job-environment detection (ringtree.bootstrap.job) and address selection (ringtree.bootstrap.netif)."""

from __future__ import annotations

import pytest

from ringtree.bootstrap.job import (
    DEFAULT_MASTER_PORT,
    JobEnv,
    detect,
    deterministic_port,
    host_identity,
    job_id,
)
from ringtree.bootstrap.netif import (
    list_interfaces,
    match_interfaces,
    parse_ifname_spec,
    select_address,
)
from ringtree.bootstrap.slurm import expand_nodelist, parse_tasks_per_node

RINGTREE = {"RINGTREE_RANK": "1", "RINGTREE_WORLD_SIZE": "6", "RINGTREE_LOCAL_RANK": "1",
            "RINGTREE_LOCAL_WORLD_SIZE": "3", "RINGTREE_MASTER_ADDR": "10.0.0.1"}
TORCHRUN = {"RANK": "2", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.2"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "10",  # one host: no address
           "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "10"}
PMI = {"PMI_RANK": "4", "PMI_SIZE": "12", "MPI_LOCALRANKID": "4", "MPI_LOCALNRANKS": "12"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
         "SLURM_TASKS_PER_NODE": "4(x4)", "SLURM_JOB_NODELIST": "node[07-10]"}


def merged(*envs: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in envs:
        out.update(e)
    return out


# ---------------------------------------------------------------------------- precedence

PRECEDENCE = [
    # (description, environ, expected (source, rank, world, local_rank, local_world))
    ("nothing", {}, ("single", 0, 1, 0, 1)),
    ("ringtree", RINGTREE, ("ringtree", 1, 6, 1, 3)),
    ("torchrun", TORCHRUN, ("torchrun", 2, 8, 0, 2)),
    ("openmpi", OPENMPI, ("openmpi", 3, 10, 3, 10)),
    ("pmi", PMI, ("pmi", 4, 12, 4, 12)),
    ("slurm", SLURM, ("slurm", 5, 16, 1, 4)),
    ("ringtree > all", merged(SLURM, PMI, OPENMPI, TORCHRUN, RINGTREE), ("ringtree", 1, 6, 1, 3)),
    ("torchrun > mpi/slurm", merged(SLURM, PMI, OPENMPI, TORCHRUN), ("torchrun", 2, 8, 0, 2)),
    ("openmpi > pmi/slurm", merged(SLURM, PMI, OPENMPI), ("openmpi", 3, 10, 3, 10)),
    ("pmi > slurm", merged(SLURM, PMI), ("pmi", 4, 12, 4, 12)),
    ("partial torchrun skipped", merged({"RANK": "1"}, OPENMPI), ("openmpi", 3, 10, 3, 10)),
    ("empty values are unset", merged({"RANK": "", "WORLD_SIZE": ""}, PMI), ("pmi", 4, 12, 4, 12)),
    ("torchrun without locals", {"RANK": "3", "WORLD_SIZE": "4"}, ("torchrun", 3, 4, 3, 4)),
    ("cray pals locals", {"PMI_RANK": "2", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "0",
                          "PMI_LOCAL_SIZE": "2", "MASTER_ADDR": "h0"}, ("pmi", 2, 4, 0, 2)),
    ("slurm legacy NPROCS", {"SLURM_PROCID": "1", "SLURM_NPROCS": "2", "SLURM_LOCALID": "1"},
     ("slurm", 1, 2, 1, 2)),
    ("slurm NTASKS_PER_NODE", {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                               "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "a,b"},
     ("slurm", 3, 4, 1, 2)),
    ("slurm uneven, node id picks entry",
     {"SLURM_PROCID": "9", "SLURM_NTASKS": "10", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
      "SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NODELIST": "n[1-3]"},
     ("slurm", 9, 10, 1, 2)),
]


@pytest.mark.parametrize("environ,expected", [p[1:] for p in PRECEDENCE],
                         ids=[p[0] for p in PRECEDENCE])
def test_precedence(environ, expected):
    e = detect(environ=environ)
    assert (e.source, e.rank, e.world_size, e.local_rank, e.local_world_size) == expected


def test_explicit_arguments_win():
    e = detect(rank=1, world_size=2, environ=merged(RINGTREE, TORCHRUN))
    assert (e.source, e.rank, e.world_size) == ("args", 1, 2)
    e = detect(rank="0", world_size="3", environ={})  # type: ignore[arg-type]
    assert (e.rank, e.world_size) == (0, 3)


def test_single_process_defaults():
    e = detect(environ={})
    assert e == JobEnv(0, 1, 0, 1, "127.0.0.1", DEFAULT_MASTER_PORT, e.token, "single", False, True)
    assert len(e.token) >= 32
    assert detect(environ={}).token != e.token  # random per process


# ---------------------------------------------------------------------------- address, port


ADDRESSES = [
    ("explicit", {"master_addr": "host-x"}, merged(RINGTREE, {"RINGTREE_MASTER_ADDR": "a",
                                                              "MASTER_ADDR": "b"}), "host-x"),
    ("RINGTREE_MASTER_ADDR", {}, merged(TORCHRUN, {"RINGTREE_MASTER_ADDR": "a",
                                                   "MASTER_ADDR": "b"}), "a"),
    ("MASTER_ADDR", {}, merged(TORCHRUN, {"MASTER_ADDR": "b"}), "b"),
    ("MASTER_ADDR beats nodelist", {}, merged(SLURM, {"MASTER_ADDR": "b"}), "b"),
    ("slurm job nodelist", {}, SLURM, "node07"),
    ("slurm step nodelist first", {}, merged(SLURM, {"SLURM_STEP_NODELIST": "gpu[3-4]"}), "gpu3"),
    ("slurm legacy nodelist", {}, merged(
        {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"},
        {"SLURM_NODELIST": "x[001-002],y"}), "x001"),
    ("loopback default", {}, {"RANK": "0", "WORLD_SIZE": "2"}, "127.0.0.1"),
    ("args: loopback default", {"rank": 1, "world_size": 4}, {}, "127.0.0.1"),
]


@pytest.mark.parametrize("kwargs,environ,expected", [a[1:] for a in ADDRESSES],
                         ids=[a[0] for a in ADDRESSES])
def test_master_addr(kwargs, environ, expected):
    assert detect(environ=environ, **kwargs).master_addr == expected


def test_master_port_precedence():
    env = merged(TORCHRUN, {"RINGTREE_MASTER_PORT": "1234", "MASTER_PORT": "5678"})
    assert detect(master_port=4321, environ=env).master_port == 4321
    assert detect(environ=env).master_port == 1234
    env.pop("RINGTREE_MASTER_PORT")
    assert detect(environ=env).master_port == 5678
    assert detect(environ=TORCHRUN).master_port == DEFAULT_MASTER_PORT
    # mpirun/PMI/Slurm without a port and without a job id: the default as well
    assert detect(environ={"PMI_RANK": "0", "PMI_SIZE": "2"}).master_port == DEFAULT_MASTER_PORT


@pytest.mark.parametrize("job_env", [
    {"OMPI_MCA_ess_base_jobid": "31457281"},
    {"PMIX_NAMESPACE": "prterun-host-12345@1"},
    {"PMI_JOBID": "77"},
    {"PMI_KVSNAME": "kvs_4242_0"},
    {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "2"},
], ids=["ompi", "pmix", "pmi-jobid", "pmi-kvs", "slurm"])
def test_deterministic_port_agrees_across_ranks(job_env):
    ranks = [merged(job_env, {"PMI_RANK": str(r), "PMI_SIZE": "4", "MPI_LOCALRANKID": str(r),
                              "MPI_LOCALNRANKS": "4"}) for r in range(4)]
    envs = [detect(environ=e) for e in ranks]
    assert len({e.master_port for e in envs}) == 1
    assert len({e.token for e in envs}) == 1  # derived token agrees too
    assert 20000 <= envs[0].master_port <= 60000
    assert envs[0].master_port == deterministic_port(job_id(ranks[0]))


def test_deterministic_port_differs_between_jobs_and_steps():
    ports = {deterministic_port(f"SLURM_JOB_ID={j}.{s}") for j in range(50) for s in range(2)}
    assert len(ports) > 90  # hash spread: distinct jobs rarely collide
    assert all(20000 <= p <= 60000 for p in ports)
    a = job_id({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"})
    b = job_id({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "1"})
    assert a != b
    assert job_id({}) is None
    assert job_id({"TORCHELASTIC_RUN_ID": "abc"}) == "TORCHELASTIC_RUN_ID=abc"


def test_token_precedence():
    env = merged(TORCHRUN, {"RINGTREE_TOKEN": "from-env"})
    assert detect(token="explicit", environ=env).token == "explicit"
    assert detect(environ=env).token == "from-env"
    derived = detect(environ=TORCHRUN).token
    assert derived == detect(environ=merged(TORCHRUN, {"RANK": "5"})).token
    other_job = merged(TORCHRUN, {"MASTER_PORT": "29600"})
    assert detect(environ=other_job).token != derived


def test_store_external_flag():
    assert detect(environ=RINGTREE).store_external is False
    for v in ("1", "true", "YES"):
        assert detect(environ=merged(RINGTREE, {"RINGTREE_STORE_EXTERNAL": v})).store_external
    assert not detect(environ=merged(RINGTREE, {"RINGTREE_STORE_EXTERNAL": "0"})).store_external


# ---------------------------------------------------------------------------- bad input


BAD = [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, {}, r"RANK='abc' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2.5"}, {}, r"WORLD_SIZE='2.5'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, {}, r"RANK=2 is outside \[0, WORLD_SIZE=2\)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, {}, r"RANK=-1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, {}, r"WORLD_SIZE=0 must be >= 1"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2",
      "MASTER_ADDR": "h"}, {},
     r"LOCAL_RANK=2 is outside"),
    (merged(TORCHRUN, {"MASTER_PORT": "70000"}), {}, r"MASTER_PORT=70000 is not a TCP port"),
    (merged(TORCHRUN, {"RINGTREE_MASTER_PORT": "0"}), {}, r"RINGTREE_MASTER_PORT=0"),
    (merged(TORCHRUN, {"MASTER_PORT": "http"}), {}, r"MASTER_PORT='http' is not an integer"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "x"}, {}, r"OMPI_COMM_WORLD_LOCAL_RANK='x'"),
    ({"RINGTREE_RANK": "0"}, {}, r"RINGTREE_RANK is set but RINGTREE_WORLD_SIZE is not"),
    ({}, {"rank": 0}, r"rank and world_size together"),
    ({}, {"rank": 3, "world_size": 2}, r"rank=3 is outside"),
    ({}, {"rank": 0, "world_size": 1.5}, r"world_size=1.5 is not an integer"),
    ({}, {"rank": 0, "world_size": 2, "master_port": 0}, r"master_port=0"),
    (merged(SLURM, {"SLURM_TASKS_PER_NODE": "4(y2)"}), {}, r"SLURM_TASKS_PER_NODE='4\(y2\)'"),
    (merged(SLURM, {"SLURM_JOB_NODELIST": "node[01-"}), {}, r"SLURM_JOB_NODELIST='node\[01-'"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, {},
     r"spans several hosts.*RINGTREE_MASTER_ADDR"),
]


@pytest.mark.parametrize("environ,kwargs,message", BAD)
def test_invalid_values_name_the_variable(environ, kwargs, message):
    with pytest.raises(ValueError, match=message):
        detect(environ=environ, **kwargs)


# ---------------------------------------------------------------------------- slurm parsing


@pytest.mark.parametrize("nodelist,hosts", [
    ("node[01-04,07],gpu3", ["node01", "node02", "node03", "node04", "node07", "gpu3"]),
    ("single", ["single"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("gpu-[3]-ib", ["gpu-3-ib"]),
    ("x[1,3],y[2-3]", ["x1", "x3", "y2", "y3"]),
    ("", []),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[01-", "node]1[", "node[a-b]", "node[5-3]", "n[1,,2]"])
def test_expand_nodelist_errors(bad):
    with pytest.raises(ValueError):
        expand_nodelist(bad)


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("4(x2),3") == [4, 4, 3]
    assert parse_tasks_per_node("8") == [8]
    assert parse_tasks_per_node("2,1(x3)") == [2, 1, 1, 1]
    with pytest.raises(ValueError):
        parse_tasks_per_node("4(x)")


# ---------------------------------------------------------------------------- host identity


def test_host_identity(monkeypatch):
    monkeypatch.delenv("RINGTREE_HOST_ID", raising=False)
    ident = host_identity()
    host, sep, boot = ident.partition("|")
    assert sep == "|" and host
    assert host_identity() == ident  # stable
    assert host_identity({"RINGTREE_HOST_ID": "fake-host-3"}) == "fake-host-3"
    monkeypatch.setenv("RINGTREE_HOST_ID", "fake-host-1")
    assert host_identity() == "fake-host-1"


# ---------------------------------------------------------------------------- netif

FAKE_IFACES = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eth0", "10.0.0.2"),
               ("eth1", "10.1.0.2"), ("ib0", "192.168.1.2")]


@pytest.mark.parametrize("spec,names", [
    ("eth", ["eth0", "eth1"]),
    ("ib,eth", ["ib0", "eth0", "eth1"]),  # earlier spec entries first
    ("eth1,eth", ["eth1", "eth0"]),
    ("^docker,lo", ["eth0", "eth1", "ib0"]),
    ("^docker", ["eth0", "eth1", "ib0", "lo"]),  # exclusion keeps loopback, but last
    ("=eth", []),  # exact: no interface is called just "eth"
    ("=eth1", ["eth1"]),
    ("=eth1,ib0", ["eth1", "ib0"]),
    ("^=eth0", ["docker0", "eth1", "ib0", "lo"]),
    (" eth0 , ib ", ["eth0", "ib0"]),
    ("wlan", []),
])
def test_match_interfaces(spec, names):
    assert [n for n, _ in match_interfaces(spec, FAKE_IFACES)] == names


def test_parse_ifname_spec():
    assert parse_ifname_spec("^=docker0,lo") == (True, True, ["docker0", "lo"])
    assert parse_ifname_spec("eth,ib") == (False, False, ["eth", "ib"])


def test_select_address_loopback_and_specs(monkeypatch):
    monkeypatch.delenv("RINGTREE_SOCKET_IFNAME", raising=False)
    ifaces = list_interfaces()
    assert ("lo", "127.0.0.1") in ifaces
    assert select_address(master_addr="127.0.0.1") == "127.0.0.1"
    assert select_address(master_addr="localhost") == "127.0.0.1"
    assert select_address("=lo", master_addr="10.9.9.9") == "127.0.0.1"
    monkeypatch.setenv("RINGTREE_SOCKET_IFNAME", "=lo")
    assert select_address(master_addr="10.9.9.9") == "127.0.0.1"  # read from the env
    with pytest.raises(ValueError, match=r"'=no-such-if0' matches no interface.*lo \(127"):
        select_address("=no-such-if0")
    addresses = {a for _, a in ifaces}
    assert select_address() in addresses | {"127.0.0.1"}


def test_select_address_routes_to_master(monkeypatch):
    monkeypatch.delenv("RINGTREE_SOCKET_IFNAME", raising=False)
    real = [(n, a) for n, a in list_interfaces() if not a.startswith("127.")]
    if not real:
        pytest.skip("no non-loopback IPv4 interface")
    name, addr = real[0]
    assert select_address(master_addr=addr) == addr  # the master is this host
    assert select_address(f"={name}") == addr
