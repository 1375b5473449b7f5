"""book.multihost.launch: real JAX processes, and no process left behind whatever happens."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import book.multihost
from book.errors import ReaderError
from book.multihost import Outputs, WorkerError, launch

# A worker that records its pid, then does what the plan says for its process index: "sleep",
# "crash" or "exit". With "child" anywhere in the plan, every worker first starts a child; with
# "daemon", a grandchild in a session of its own whose parent has exited (a double fork).
SLEEPER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    folder, *plan = sys.argv[1:]
    me = int(os.environ["JAX_PROCESS_ID"])
    pids = [os.getpid()]
    if "child" in plan:
        pids.append(subprocess.Popen(["sleep", "300"]).pid)
    if "daemon" in plan:
        read, write = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(write, str(os.getpid()).encode())
                os.execvp("sleep", ["sleep", "300"])  # its command line names no folder
            os._exit(0)
        os.close(write)
        pids.append(int(os.read(read, 32)))
    with open(os.path.join(folder, f"pids.{me}.tmp"), "w") as f:
        f.write(" ".join(map(str, pids)))
    os.rename(os.path.join(folder, f"pids.{me}.tmp"), os.path.join(folder, f"pids.{me}"))
    print(f"worker {me} started", flush=True)
    action = plan[me] if me < len(plan) and plan[me] not in ("child", "daemon") else "sleep"
    if action == "crash":
        time.sleep(0.3)
        raise ValueError(f"worker {me} cannot go on")
    if action == "exit":
        sys.exit(0)
    time.sleep(300)
    """
)


@pytest.fixture
def sleeper(tmp_path):
    script = tmp_path / "sleeper_worker.py"
    script.write_text(SLEEPER)
    return script


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie has already died)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pid_files(folder: Path) -> list[Path]:
    """The workers' finished pid files, pids.<process>: not one still being written (.tmp)."""
    return sorted(f for f in folder.glob("pids.*") if f.suffix[1:].isdigit())


def recorded_pids(folder: Path) -> list[int]:
    return [int(p) for f in pid_files(folder) for p in f.read_text().split()]


def wait_for_pid_files(folder: Path, count: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(pid_files(folder)) < count:
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)


def assert_nothing_left(folder: Path, pids=()) -> None:
    """No process that was started from ``folder`` is still running (what `ps` would show)."""
    deadline = time.monotonic() + 30  # ended processes take a moment to go on a loaded machine
    while True:
        left = [pid for pid in pids if alive(pid)]
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(folder) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(proc.info["pid"])
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(set(left))}"


JAX_WORKER = textwrap.dedent(
    """
    import os
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    mine = np.array([jax.process_index() + 1])
    total = multihost_utils.process_allgather(mine).sum()
    print(f"index {jax.process_index()} of {jax.process_count()}")
    print(f"devices {jax.local_device_count()} of {jax.device_count()}")
    print(f"platform {jax.devices()[0].platform}")
    print(f"sum {total}")
    print(f"args {os.sys.argv[1:]}")
    """
)


def test_launch_runs_real_jax_processes(tmp_path):
    script = tmp_path / "jax_worker.py"
    script.write_text(JAX_WORKER)
    outputs = launch(script, num_processes=2, devices_per_process=4, timeout=60, args=["a", 1])
    assert isinstance(outputs, Outputs) and len(outputs) == 2
    for i, out in enumerate(outputs):
        assert f"index {i} of 2" in out
        assert "devices 4 of 8" in out
        assert "platform cpu" in out
        assert "sum 3" in out  # 1 + 2, gathered over gloo
        assert "args ['a', '1']" in out
        assert "[Gloo]" not in out
    assert_nothing_left(tmp_path)


def test_what_a_workers_own_programs_print_is_kept(tmp_path):
    script = tmp_path / "programs.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, subprocess, sys
            print("from python", flush=True)
            subprocess.run(["echo", "from echo"])
            assert os.system("echo from os.system") == 0 and os.system("exit 3") == 3 << 8
            captured = subprocess.run(["echo", "x"], capture_output=True, text=True).stdout
            print("captured", captured.strip(), flush=True)
            """
        )
    )
    (out,) = launch(script, num_processes=1, timeout=60)
    assert out.split("\n")[:4] == ["from python", "from echo", "from os.system", "captured x"]


def test_an_exit_code_past_255_is_explained(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit(300)\n")
    with pytest.raises(WorkerError, match="exit code 300 reaches the launcher as 44"):
        launch(script, num_processes=1, timeout=60)


def test_each_worker_finds_its_environment(tmp_path):
    script = tmp_path / "env_worker.py"
    script.write_text(
        "import os\n"
        "for k in ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID',\n"
        "          'JAX_NUM_CPU_DEVICES', 'JAX_PLATFORMS', 'JAX_CPU_COLLECTIVES_IMPLEMENTATION',\n"
        "          'EXTRA', 'HOME'):\n"
        "    print(k, os.environ.get(k))\n"
    )
    outputs = launch(
        script,
        num_processes=3,
        devices_per_process=2,
        env=lambda i: {"EXTRA": f"x{i}", "HOME": None},
    )
    addresses = set()
    for i, out in enumerate(outputs):
        fields = dict(line.split(" ", 1) for line in out.splitlines())
        addresses.add(fields["JAX_COORDINATOR_ADDRESS"])
        assert fields["JAX_NUM_PROCESSES"] == "3"
        assert fields["JAX_PROCESS_ID"] == str(i)
        assert fields["JAX_NUM_CPU_DEVICES"] == "2"
        assert fields["JAX_PLATFORMS"] == "cpu"
        assert fields["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
        assert fields["EXTRA"] == f"x{i}"
        assert fields["HOME"] == "None"
    (address,) = addresses
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert_nothing_left(tmp_path)


def test_a_crash_stops_the_others_at_once(sleeper, tmp_path):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        launch(sleeper, num_processes=3, timeout=60, args=[tmp_path, "sleep", "crash", "sleep"])
    elapsed = time.monotonic() - start
    err = caught.value
    assert isinstance(err, ReaderError)
    assert err.process == 1
    message = str(err)
    assert message.startswith("Worker process 1 of 3 running sleeper_worker.py failed")
    assert "ValueError: worker 1 cannot go on" in message  # the tail of its log
    assert err.outputs[0] == "worker 0 started\n"
    assert elapsed < 15, f"the launch took {elapsed:.1f} s to notice the crash"
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3
    assert_nothing_left(tmp_path, pids)


BARRIER_WORKER = textwrap.dedent(
    """
    import os
    import jax
    from jax.experimental import multihost_utils

    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    if jax.process_index() == 1:
        raise RuntimeError("process 1 gives up")
    multihost_utils.sync_global_devices("never reached by process 1")
    """
)


def test_a_jax_worker_that_raises_is_reported_at_once(tmp_path):
    """Not after jax.distributed's shutdown barrier, where a raising worker would wait."""
    script = tmp_path / "barrier_worker.py"
    script.write_text(BARRIER_WORKER)
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        launch(script, timeout=60)
    elapsed = time.monotonic() - start
    assert caught.value.process == 1
    message = str(caught.value)
    assert "RuntimeError: process 1 gives up" in message
    assert 'barrier_worker.py", line 11, in <module>' in message
    assert "runpy" not in message  # the launcher's own frames are left out
    assert elapsed < 15, f"the failure took {elapsed:.1f} s to be reported"
    assert_nothing_left(tmp_path)


def test_a_hang_is_killed_at_the_timeout_with_its_siblings(sleeper, tmp_path):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        # Process 0 exits, process 1 hangs; each has started a child of its own.
        launch(sleeper, num_processes=2, timeout=3, args=[tmp_path, "exit", "child"])
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 10
    assert caught.value.process == 1
    assert "Worker process 1 of 2 running sleeper_worker.py still ran after 3 s" in str(
        caught.value
    )
    assert "worker 1 started" in str(caught.value)
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4  # two workers and their children
    assert_nothing_left(tmp_path, pids)


def test_a_daemon_that_left_its_session_ends_with_the_launch(sleeper, tmp_path):
    # Each worker double-forks a daemon; process 0 then exits, process 1 hangs until killed.
    with pytest.raises(WorkerError):
        launch(sleeper, num_processes=2, timeout=3, args=[tmp_path, "exit", "daemon"])
    pids = recorded_pids(tmp_path)
    assert len(pids) == 4  # two workers and their daemons
    assert_nothing_left(tmp_path, pids)


DRIVER = (
    "import sys, book.multihost as m; "
    "m.launch(sys.argv[1], num_processes=2, timeout=120, args=[sys.argv[2], 'child'])"
)


def test_an_interrupt_kills_every_worker_and_is_raised_again(sleeper, tmp_path):
    """What a notebook's interrupt button does: SIGINT to the process running launch."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(sleeper), str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_pid_files(tmp_path, 2)
        pids = recorded_pids(tmp_path)
        assert all(alive(pid) for pid in pids)
        driver.send_signal(signal.SIGINT)
        _, stderr = driver.communicate(timeout=20)
    finally:
        driver.kill()
        driver.wait()
    assert "KeyboardInterrupt" in stderr
    assert driver.returncode != 0
    assert len(pids) == 4  # two workers and their children
    assert_nothing_left(tmp_path, pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_launcher(sleeper, tmp_path):
    """A kernel killed outright runs no cleanup; the workers must still go."""
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER.replace("'child'", "'sleep'"),
            str(sleeper),
            str(tmp_path),
        ]
    )
    try:
        wait_for_pid_files(tmp_path, 2)
        pids = recorded_pids(tmp_path)
        assert all(alive(pid) for pid in pids)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait()
    assert_nothing_left(tmp_path, pids)


def test_bad_arguments_get_one_sentence(tmp_path):
    with pytest.raises(ReaderError, match="There is no worker script at"):
        launch(tmp_path / "missing.py")
    script = tmp_path / "ok.py"
    script.write_text("")
    for kwargs, name in [
        ({"num_processes": 0}, "num_processes"),
        ({"devices_per_process": 1.5}, "devices_per_process"),
        ({"timeout": 0}, "timeout"),
    ]:
        with pytest.raises(ReaderError, match=name):
            launch(script, **kwargs)


def test_outputs_show_every_process_escaped():
    outputs = Outputs(["a <b>\n", ""])
    assert outputs == ["a <b>\n", ""]
    html = outputs._repr_html_()
    assert "process 0" in html and "process 1" in html
    assert "a &lt;b&gt;" in html and "(no output)" in html
    assert repr(outputs) == "--- process 0 ---\na <b>\n--- process 1 ---\n"


def test_gloo_notices_are_left_out(tmp_path):
    path = tmp_path / "0.out"
    path.write_text(
        "one\n[Gloo] Rank 3 is connected to 7 peer ranks. "
        "Expected number of connected peer ranks is : 7\ntwo\n"
    )
    assert book.multihost._read(path) == "one\ntwo\n"
    notice = (
        "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : "
    )
    path.write_text(f"one\n{notice}{notice}1\n1\ntwo\n")  # two threads, interleaved
    assert book.multihost._read(path) == "one\ntwo\n"


def test_native_stdout_stays_out_of_the_output(tmp_path):
    """Native code writes to file descriptor 1 (Gloo, from several threads at once); Python's
    print is what the output holds, however the two interleave."""
    script = tmp_path / "native.py"
    script.write_text(
        "import os\n"
        "print('before')\n"
        "os.write(1, b'[Gloo] Rank 2 is connected to 7 peer ranks. [Gloo] Rank ')\n"
        "print('a long line', end='')\n"
        "print(' ends here')\n"
        "os.write(1, b'1 is connected to 7 peer ranks.\\n')\n"
    )
    outputs = launch(script, num_processes=2, timeout=30)
    assert outputs == ["before\na long line ends here\n"] * 2
    assert_nothing_left(tmp_path)


def test_long_lines_wrap_in_their_column():
    html = Outputs(["x" * 500])._repr_html_()
    rule = re.search(r"\.bk-process pre \{([^}]*)\}", html)
    assert "class='bk-process'" in html and rule, html[-400:]
    assert "white-space: pre-wrap" in rule.group(1) and "overflow-wrap: anywhere" in rule.group(1)


def test_free_ports_differ_and_bind():
    import socket

    port = book.multihost.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert os.environ.get("JAX_PROCESS_ID") is None  # launch never touches its own environment
    outgoing = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if outgoing.exists():  # below the ports outgoing connections take, so none takes it first
        assert 1024 <= port < int(outgoing.read_text().split()[0])


# Faults: each checks that no process and no folder of the launch is left.


def folders_of(pid: int) -> list[Path]:
    """The launch folders a process made, by the pid in their names."""
    return sorted(Path(tempfile.gettempdir()).glob(f"book-multihost-{pid}-*"))


@pytest.mark.parametrize(
    "timeout, why",
    [
        (float("nan"), "not nan"),
        (0, "more than 0 seconds"),
        (-5, "more than 0 seconds"),
        (float("inf"), "longer than the book ever waits"),
        (10**400, "longer than the book ever waits"),
        (True, "number of seconds"),
        ("60", "number of seconds"),
    ],
    ids=["nan", "zero", "negative", "inf", "10**400", "True", "text"],
)
def test_timeouts_that_cannot_work_are_refused(tmp_path, timeout, why):
    script = tmp_path / "ok.py"
    script.write_text("")
    with pytest.raises(ReaderError, match=why) as caught:
        launch(script, timeout=timeout)
    assert "\n" not in str(caught.value)
    assert not folders_of(os.getpid())


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"num_processes": 1000}, "more processes than this machine can run at once"),
        ({"num_processes": 2**31}, "more processes than this machine can run at once"),
        ({"num_processes": True}, "positive whole number"),
        ({"num_processes": "2"}, "positive whole number"),
        ({"devices_per_process": 10**6}, "more CPU devices than one process needs"),
        ({"args": "abc"}, "list or tuple"),
        ({"args": [object()]}, "a text, a number or a path"),
        ({"env": {"A": object()}}, "give a text, a number, or None"),
        ({"env": {"A=B": "1"}}, "not a variable name"),
        ({"env": lambda i: 1 / 0}, "env\\(0\\) raised ZeroDivisionError"),
        ({"env": 5}, "mapping of variables"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_arguments_that_cannot_work_are_refused_before_any_process(tmp_path, kwargs, why):
    script = tmp_path / "ok.py"
    script.write_text("")
    with pytest.raises(ReaderError, match=why) as caught:
        launch(script, **kwargs)
    assert "\n" not in str(caught.value)
    assert not folders_of(os.getpid())


def test_numpy_integers_are_process_counts(tmp_path):
    import numpy as np

    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    assert launch(script, num_processes=np.int64(2), devices_per_process=np.int32(1)) == [
        "hello\n",
        "hello\n",
    ]


def test_a_crash_leaves_no_process_and_no_folder(sleeper, tmp_path):
    with pytest.raises(WorkerError, match="ValueError: worker 0 cannot go on"):
        launch(sleeper, num_processes=2, timeout=60, args=[tmp_path, "crash", "child"])
    assert_nothing_left(tmp_path, recorded_pids(tmp_path))
    assert not folders_of(os.getpid())


def test_a_flood_of_output_keeps_only_its_tail(tmp_path):
    """5 MB on one line of stderr, and 2 MB of printed lines: the error is a few lines long."""
    script = tmp_path / "flood.py"
    script.write_text(
        "import sys\n"
        "for k in range(200_000):\n"
        "    print(f'line {k:07d}')\n"
        "sys.stderr.write('x' * 5_000_000 + '\\n')\n"
        "sys.exit(3)\n"
    )
    with pytest.raises(WorkerError) as caught:
        launch(script, num_processes=2, timeout=60)
    message = str(caught.value)
    assert len(message) < 3000, len(message)
    assert "failed with exit code 3" in message and "more characters)" in message
    out = caught.value.outputs[caught.value.process]  # it printed everything, then failed
    assert out.startswith("[") and "earlier bytes of output left out]" in out.splitlines()[0]
    assert out.rstrip().endswith("line 0199999")
    assert len(out) <= book.multihost.OUTPUT_BYTES + 100
    assert_nothing_left(tmp_path)
    assert not folders_of(os.getpid())


GRANDPARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    folder, how = sys.argv[1:]
    me = int(os.environ["JAX_PROCESS_ID"])
    if how == "direct":  # a child in a session of its own, left running
        pid = subprocess.Popen(["sleep", "300"], start_new_session=True).pid
    else:  # a grandchild in its own session whose parent has already exited
        code = (
            "import subprocess as s; print(s.Popen(['sleep', '300'], start_new_session=True, "
            "stdout=s.DEVNULL, stderr=s.DEVNULL).pid)"
        )
        pid = int(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True).stdout)
    with open(os.path.join(folder, f"pids.{me}.tmp"), "w") as f:
        f.write(str(pid))
    os.rename(os.path.join(folder, f"pids.{me}.tmp"), os.path.join(folder, f"pids.{me}"))
    print("started", pid, flush=True)
    if how == "exit_at_once":
        time.sleep(0.6)  # long enough for launch to see it
        os._exit(0)
    """
)


@pytest.mark.parametrize("how", ["direct", "orphan", "exit_at_once"])
def test_what_workers_start_in_sessions_of_their_own_ends_with_the_launch(tmp_path, how):
    script = tmp_path / "grandparent.py"
    script.write_text(GRANDPARENT)
    outputs = launch(script, num_processes=2, timeout=60, args=[tmp_path, how])
    assert all(out.startswith("started") for out in outputs)
    pids = recorded_pids(tmp_path)
    assert len(pids) == 2
    assert_nothing_left(tmp_path, pids)
    assert not folders_of(os.getpid())


def test_the_time_limit_covers_starting_the_workers(tmp_path, monkeypatch):
    """Workers that take long to start count against the timeout too."""
    script = tmp_path / "quick.py"
    script.write_text("print('done')\n")
    real_popen = subprocess.Popen

    def slow_popen(*args, **kwargs):
        time.sleep(0.6)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(book.multihost.subprocess, "Popen", slow_popen)
    with pytest.raises(WorkerError, match="had started after 1 s"):
        launch(script, num_processes=4, timeout=1)
    assert_nothing_left(tmp_path)
    assert not folders_of(os.getpid())


def test_a_port_clash_is_named(tmp_path):
    """Another program listens on the coordinator's port: process 0 cannot start it."""
    import socket

    script = tmp_path / "jax_worker.py"
    script.write_text(JAX_WORKER)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            WorkerError, match=f"could not listen on 127.0.0.1:{port}: another program"
        ) as caught:
            launch(
                script,
                num_processes=2,
                devices_per_process=1,
                timeout=60,
                env={"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}"},
            )
    assert "\n" not in str(caught.value)
    assert_nothing_left(tmp_path)
    assert not folders_of(os.getpid())


def test_a_taken_port_is_replaced_by_a_free_one(tmp_path, monkeypatch):
    """Another program took the port launch chose: the workers start again on a new one."""
    import socket

    script = tmp_path / "jax_worker.py"
    script.write_text(JAX_WORKER)
    chosen = book.multihost.free_port
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(book.multihost, "free_port", lambda: next(ports, None) or chosen())
        outputs = launch(script, num_processes=2, devices_per_process=1, timeout=60)
    assert [text.splitlines()[0] for text in outputs] == ["index 0 of 2", "index 1 of 2"]
    assert next(ports, None) is None  # the taken port was tried first
    assert_nothing_left(tmp_path)
    assert not folders_of(os.getpid())


def test_a_workers_own_address_in_use_is_its_own_error(tmp_path):
    """The words gRPC prints for the coordinator, printed by the script itself: one run."""
    script = tmp_path / "w.py"
    runs = tmp_path / "runs"
    script.write_text(
        "import os, sys\n"
        f"open({str(runs)!r}, 'a').write('ran\\n')\n"
        "sys.exit('my server: [Errno 98] Address already in use')\n"
    )
    with pytest.raises(WorkerError, match="exit code 1") as caught:
        launch(script, num_processes=2, devices_per_process=1, timeout=30)
    assert not caught.value.port_taken and "coordinator" not in str(caught.value)
    assert runs.read_text().count("ran") <= 2  # each worker at most once: no second launch
    assert_nothing_left(tmp_path)


def test_a_stopped_job_keeps_its_output_and_refuses_to_wait(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("print('hello from a worker')\n")
    with book.multihost.start(script, num_processes=2, devices_per_process=1, timeout=30) as job:
        assert job.wait_for_exits() == [0, 0]
    assert job.output(1) == "hello from a worker\n"
    assert [text.strip() for text in job.outputs()] == ["hello from a worker"] * 2
    for call in (
        job.wait,
        job.wait_for_exits,
        lambda: job.wait_for("hello"),
        lambda: job.signal(15),
    ):
        with pytest.raises(ReaderError, match="has stopped"):
            call()
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("pattern", [r"^(a+)+$", r"(a|aa)+$", r"(\d+\.)+"])
def test_a_pattern_that_can_search_for_hours_is_refused(tmp_path, pattern):
    script = tmp_path / "w.py"
    script.write_text("print('a' * 40 + '!', flush=True)\n")
    with book.multihost.start(script, num_processes=1, devices_per_process=1, timeout=30) as job:
        with pytest.raises(ReaderError, match="can search for hours"):
            job.wait_for(pattern)
    assert_nothing_left(tmp_path)


DRIVER_SESSION = (
    "import sys, book.multihost as m; "
    "m.launch(sys.argv[1], num_processes=2, timeout=120, args=[sys.argv[2], 'direct'])"
)
WAITER = GRANDPARENT + "\ntime.sleep(300)\n"


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_a_stopped_launcher_leaves_no_grandchild_and_no_folder(tmp_path, how):
    """SIGINT (a notebook's interrupt button) or SIGKILL (a kernel killed outright)."""
    if how == "kill" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER_SESSION, str(script), str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_pid_files(tmp_path, 2)
        time.sleep(0.5)  # the workers are past writing their pid files
        pids = recorded_pids(tmp_path)
        assert all(alive(pid) for pid in pids) and folders_of(driver.pid)
        driver.send_signal(signal.SIGINT if how == "interrupt" else signal.SIGKILL)
        _, stderr = driver.communicate(timeout=30)
    finally:
        driver.kill()
        driver.wait()
    if how == "interrupt":
        assert "KeyboardInterrupt" in stderr
    assert_nothing_left(tmp_path, pids)
    # The workers' watchers remove the folder; on a loaded machine that can take a while.
    deadline = time.monotonic() + 30
    while folders_of(driver.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folders_of(driver.pid)


def test_folders_of_dead_launchers_are_swept(tmp_path):
    stale = Path(tempfile.mkdtemp(prefix="book-multihost-999999999-"))
    (stale / "0.out").write_text("left behind")
    script = tmp_path / "ok.py"
    script.write_text("")
    launch(script, num_processes=2, devices_per_process=1)
    assert not stale.exists()


# book.multihost.start: the workers handed back running, for what a scheduler does to a job.


def test_a_started_job_is_watched_signalled_and_left_to_end_by_itself(sleeper, tmp_path):
    with book.multihost.start(sleeper, 2, 1, timeout=60, args=[tmp_path]) as job:
        assert job.wait_for(r"^worker (\d) started$", process=1).group(1) == "1"
        job.wait_for(r"^worker 0 started$", process=0)
        job.signal(signal.SIGTERM, process=0)
        assert_exit = time.monotonic() + 20
        while job.exit_codes()[0] is None:
            assert time.monotonic() < assert_exit, "process 0 outlived its SIGTERM"
            time.sleep(0.05)
        assert job.exit_codes() == [-signal.SIGTERM, None]  # the other one still runs
        job.signal(signal.SIGKILL)  # to every worker still running
        assert job.wait_for_exits() == [-signal.SIGTERM, -signal.SIGKILL]
        assert set(job.ended) == {0, 1} and job.outputs()[1] == "worker 1 started\n"
        # once they have exited, nothing is sent, and the answer says so
        assert job.signal(signal.SIGTERM) == "nothing sent: every worker had already exited"
        assert job.signal(signal.SIGTERM, 1) == "nothing sent: worker 1 had already exited"
        folder = job.folder
    assert not folder.exists()
    assert_nothing_left(tmp_path, recorded_pids(tmp_path))


def test_waiting_for_a_line_stops_at_a_failure_as_launch_does(sleeper, tmp_path):
    with book.multihost.start(sleeper, 2, 1, timeout=60, args=[tmp_path, "crash"]) as job:
        with pytest.raises(WorkerError) as caught:
            job.wait_for(r"^never printed$", process=1)
    assert caught.value.process == 0 and caught.value.raised == "builtins.ValueError"
    assert_nothing_left(tmp_path, recorded_pids(tmp_path))


def test_leaving_the_block_stops_every_worker(sleeper, tmp_path):
    with book.multihost.start(sleeper, 2, 1, timeout=60, args=[tmp_path, "child"]) as job:
        wait_for_pid_files(tmp_path, 2)
    assert all(code is not None for code in job.exit_codes())
    assert_nothing_left(tmp_path, recorded_pids(tmp_path))


def test_a_job_names_a_process_it_does_not_have(sleeper, tmp_path):
    with book.multihost.start(sleeper, 2, 1, timeout=60, args=[tmp_path]) as job:
        with pytest.raises(ReaderError, match="process"):
            job.signal(signal.SIGTERM, process=2)


def test_a_job_started_without_a_with_block_is_stopped_after_its_timeout(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    job = book.multihost.start(script, num_processes=1, devices_per_process=1, timeout=1)
    job.wait_for("up")
    waited = time.monotonic()
    while job.exit_codes() == [None] and time.monotonic() - waited < 30:
        time.sleep(0.2)
    assert job.exit_codes() != [None] and job.output(0) == "up\n"
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("key", ["JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_NUM_CPU_DEVICES"])
def test_env_cannot_set_what_launch_gives_each_worker(tmp_path, key):
    script = tmp_path / "w.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ReaderError, match=f"env cannot set {key}"):
        book.multihost.launch(script, 2, 1, timeout=30, env={key: "1"})


def by_hand(tmp_path, chapter, script, args, devices=None):
    """A chapter's worker script, as its %%writefile cell writes it, run by hand: no launcher
    and no Slurm task around it."""
    import json as json_

    notebook = Path(__file__).resolve().parent.parent / "notebooks" / f"{chapter}.ipynb"
    (source,) = [
        "".join(c["source"])
        for c in json_.loads(notebook.read_text())["cells"]
        if "".join(c["source"]).startswith(f"%%writefile {script}")
    ]
    path = tmp_path / script
    path.write_text(source.partition("\n")[2])
    env = {**os.environ, "PYTHONPATH": str(notebook.parent.parent), "JAX_PLATFORMS": "cpu"}
    env = {k: v for k, v in env.items() if not k.startswith(("JAX_NUM_PROC", "SLURM_"))}
    if devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
    return subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "chapter, script, bad",
    [
        ("11_multi_controller", "multihost_train.py", ["data", "2"]),
        ("16_training_state", "resume_training.py", ["c", "d"]),
        ("17_profiling", "compile_step.py", ["cache", '{"a": 1}']),
        ("17_profiling", "compile_step.py", []),
    ],
)
def test_a_chapters_worker_script_typed_wrong_by_hand_says_how_to_call_it(
    tmp_path, chapter, script, bad
):
    done = by_hand(tmp_path, chapter, script, bad)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(f"{script}: give its ") and "python " in done.stderr


RUN = json.dumps(  # chapter 16's settings, as it writes them for resume_training.py
    {"sizes": [8], "learning_rate": 0.1, "weight_decay": 0, "decayed": {}, "layout": {}}
    | {"first_step": 0, "steps": 1}
)


@pytest.mark.parametrize(
    "chapter, script, args, devices, said",
    [
        ("11_multi_controller", "multihost_train.py", ["data", "1", "8"], 1, "no peers"),
        ("16_training_state", "resume_training.py", [".", "d", RUN], 1, "no peers"),
        ("16_training_state", "resume_training.py", ["c", "d", RUN], 1, "no folder at 'c'"),
        ("16_training_state", "resume_training.py", [".", "d", "{}"], 1, "Give a JSON object"),
        ("17_profiling", "compile_step.py", ["gs://b/c", "[8, 16, 32, 8]"], 8, "No folder can"),
        ("17_profiling", "compile_step.py", ["cache", "[8, 16, 32, 4]"], 8, "multiple of 8"),
        ("17_profiling", "compile_step.py", ["cache", '"abcd"'], 8, "multiple of 8"),
        ("17_profiling", "compile_step.py", ["cache", "[8, 16.0, 32, 8]"], 8, "multiple of 8"),
        ("17_profiling", "compile_step.py", ["cache", "[8, 131072, 8, 8]"], 8, "too large"),
        ("11_multi_controller", "multihost_train.py", ["data", "0", "8"], 1, "a count must"),
    ],
)
def test_a_chapters_worker_script_run_by_hand_ends_in_one_sentence(
    tmp_path, chapter, script, args, devices, said
):
    # Valid arguments and no launcher around it, or sizes its devices cannot split.
    done = by_hand(tmp_path, chapter, script, args, devices)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"{script}: ") and said in line
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("argv", [["x.py"], ["x.py", "[" * 100_000], ["x.py", "nan?"]])
def test_script_args_ends_a_mistyped_command_with_its_usage(monkeypatch, argv):
    import json as json_

    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stop:
        book.multihost.script_args("Usage:\n\n    python x.py JSON\n", json_.loads)
    assert str(stop.value.code) == "x.py: give its argument as in: python x.py JSON"


def test_a_workers_reader_error_comes_back_as_its_one_line_under_launch(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(
        '"""Usage:\n\n    python worker.py X\n"""\nimport book.multihost\n'
        "from book.errors import ReaderError\n"
        "(x,) = book.multihost.script_args(__doc__, str)\n"
        'raise ReaderError("give a global batch divisible by 4.")\n'
    )
    with pytest.raises(book.multihost.WorkerError) as failed:
        book.multihost.launch(worker, 1, 1, timeout=60, args=["a"])
    assert "worker.py: give a global batch divisible by 4." in str(failed.value)
    assert "Traceback" not in str(failed.value)


def test_folder_kinds_read_a_tilde_as_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # a shell leaves ~ alone after --flag=
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step_8").mkdir()
    assert book.multihost.folder("~/ckpt") == str(tmp_path / "ckpt")
    assert book.multihost.new_folder("~/cache") == str(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # tried, not made


def test_the_script_argument_kinds_for_folders_and_settings(tmp_path):
    from book.errors import ReaderError

    (tmp_path / "empty").mkdir()
    assert book.multihost.folder(str(tmp_path)) == str(tmp_path)
    assert book.multihost.new_folder(str(tmp_path / "cache")) == str(tmp_path / "cache")
    settings = book.multihost.json_object("sizes steps")
    assert settings('{"sizes": [1], "steps": 2}') == {"sizes": [1], "steps": 2}
    (tmp_path / "file").write_text("x")
    for kind, text, words in [
        (book.multihost.folder, str(tmp_path / "nosuch"), "There is no folder at"),
        (book.multihost.folder, str(tmp_path / "empty"), "is empty; give the one"),
        (book.multihost.new_folder, "gs://bucket/cache", "No folder can be made at"),
        (book.multihost.new_folder, str(tmp_path / "file"), "No folder can be made at"),
        (book.multihost.new_folder, str(tmp_path / "file" / "c"), "No folder can be made at"),
        (settings, "[]", "Give a JSON object holding sizes, steps"),
        (settings, '{"sizes": 1}', "Give a JSON object holding sizes, steps"),
    ]:
        with pytest.raises(ReaderError, match=words):
            kind(text)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"JAX_NUM_PROCESSES": "٢", "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES"),  # not ASCII
        ({"JAX_NUM_PROCESSES": "0", "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES"),
        ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "-1"}, "JAX_PROCESS_ID"),
        ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}, "JAX_COORDINATOR_ADDRESS"),
        ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "h:0"},
         "JAX_COORDINATOR_ADDRESS"),
    ],
)  # fmt: skip
def test_launched_names_the_variable_set_wrong(monkeypatch, env, named):
    for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.argv", ["resume_training.py"])
    with pytest.raises(SystemExit) as stop:
        book.multihost.launched()
    assert str(stop.value.code).startswith(f"resume_training.py: set {named}")


def test_launched_reads_what_launch_sets(monkeypatch):
    env = book.multihost.worker_env(1, 2, 4, "[::1]:12345")
    for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.setenv(name, env[name])
    assert book.multihost.launched() == (2, 1)
