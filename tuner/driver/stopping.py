"""Ctrl-C and SIGTERM during a sweep: tuner's own signal handler, not Tune's; and the driver
watched from outside, so that a signal that kills its Ray too still ends in a resumable sweep.

The first SIGINT (Ctrl-C), SIGTERM (`ray job stop`, a batch system) or SIGHUP (a terminal hung
up) sets INTERRUPTED, and Tune, asked through a Stopper (limits.UserStopped), ends the
experiment at its next step: running trials stop at their next report with their checkpoints
kept, and are recorded as unfinished (callbacks.TrialRecordCallback), for `tuner resume` to
continue. A second Ctrl-C stops at once (KeyboardInterrupt); SIGTERM and SIGHUP only ever ask
for the graceful stop (a batch system or the watcher may send the same request twice). Tune's
own SIGINT handler is switched off through its documented TUNE_DISABLE_SIGINT_HANDLER: whether
a trial was stopped by the user is decided from tuner's own flag and the trial's state, never
from the wording of one of Tune's log lines.

`watched` runs a command that starts a private local Ray in a child process of its own process
group and waits, Ray-free. A signal for the whole process group (`kill -TERM -PGID`, Ctrl-C,
a terminal's hangup) reaches only the watcher, which passes it on once: the driver stops
gracefully while its Ray lives on. A signal for every process (SLURM's `scancel`, which signals
all of a job's processes) kills the Ray too, and Ray 2.60 ends its driver with it (exit 1, at
once or after 60 s without its GCS), or leaves it waiting for reports that cannot come: the
watcher sees the Ray's processes gone, ends what is left of the driver, writes summary.json
from the trials' own records (status interrupted), tells notify.webhook unless the driver
already did, and exits 130, for `resume` to continue.

Ctrl-Z (SIGTSTP for the terminal's foreground group) likewise reaches only the watcher: it stops
the driver's group (the driver and its Ray), then itself; when `fg` or `bg` continues it, it
continues them. A shell's job is the whole sweep, as it was before the driver had a group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tuner.errors import ExitCode

# Set by the first stop signal of the running sweep: the trials Tune stops after it were cut
# short by the user, not finished.
INTERRUPTED = threading.Event()
STOPPING = "[tuner] stopping: trials end at their next report, state is saved; Ctrl-C again to stop at once"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NOTIFIED = b"notified"  # what a watched driver tells its watcher once it notified the webhook
_to_watcher: list[int] = []  # in a watched driver: the pipe to its watcher


@contextlib.contextmanager
def user_stops() -> Iterator[None]:
    """Around Tune's fit(): the first SIGINT, SIGTERM or SIGHUP stops the sweep gracefully, a
    second SIGINT at once. One ignored when the command began stays ignored (`nohup`'s SIGHUP,
    SIGINT for a background job of a shell without job control), as Python leaves an ignored
    SIGINT. Outside the main thread (where no handler can be set) Python's defaults stay."""
    INTERRUPTED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    again = before[signal.SIGINT] if callable(before[signal.SIGINT]) else signal.default_int_handler
    ttys = on_a_terminal()
    ours = [s for s in STOP_SIGNALS if before[s] != signal.SIG_IGN]

    def first(signum: int, frame: Any) -> None:
        # Set from another thread: this handler runs in the main thread between two bytecodes,
        # maybe inside INTERRUPTED.wait() holding the Event's lock, and set() there deadlocked.
        threading.Thread(target=INTERRUPTED.set, name="interrupted").start()
        if signal.SIGINT in ours:
            signal.signal(signal.SIGINT, again)  # the next one stops at once
        try:
            print(STOPPING, file=sys.stderr, flush=True)
        except (OSError, ValueError, RuntimeError):  # a closed stream, or one in mid-write
            pass

    def graceful(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            off_a_hung_up_terminal(ttys)
        if not INTERRUPTED.is_set():
            first(signum, frame)

    tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    for s in ours:
        signal.signal(s, first if s == signal.SIGINT else graceful)
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None:  # (None: set outside Python, and not ours to restore)
                signal.signal(s, handler)
        if tune_handler is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler


def on_a_terminal() -> tuple[int, ...]:
    """The standard streams (file descriptors) that are a terminal now."""
    return tuple(fd for fd in (0, 1, 2) if os.isatty(fd))


def off_a_hung_up_terminal(ttys: tuple[int, ...]) -> None:
    """After a terminal's hangup (a SIGHUP): those of `ttys` that are a terminal no more now
    read and write /dev/null, as under nohup. Writing to a hung-up terminal fails (EIO): the
    driver's next line ended it with an OSError instead of the graceful stop SIGHUP asks for.
    A stream still on a live terminal stays (a SIGHUP from `kill` is no hangup)."""
    gone = [fd for fd in ttys if not os.isatty(fd)]
    if gone:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in gone:
            os.dup2(null, fd)
        os.close(null)


# ------------------------------------------------------------------ the driver watched

POLL_S = 0.2  # how often the watcher looks at its driver
SCAN_EVERY = 5  # polls between two listings of the driver's processes (each reads all of /proc)
RAY_PROCESSES = ("raylet", "gcs_server")  # a private local Ray's own: gone, the Ray is gone
_PR_SET_PDEATHSIG = 1  # prctl(2)


def watched(run: Callable[[], int], settle: Callable[[int, bool], int]) -> int:
    """`run()` in a child process (the driver), this one waiting for it; its exit code.

    The child has a process group of its own and dies with this process (a `kill -9` of the
    command kills the sweep, as before). Stop signals for this process are passed on to it
    once. When the child ends without having returned from `run` (killed, or ended by Ray),
    or it is ended here because its Ray is gone after a stop signal, `settle(code, notified)`
    gives the exit code: it writes what the sweep has (and notifies the webhook unless the
    driver said it did: `notified`). Ctrl-Z stops the child's group with this process. Where a
    child cannot be made safely, or would not die with this process (not Linux, threads already
    running, not the main thread), `run()` runs here."""
    if (
        not sys.platform.startswith("linux")
        or threading.active_count() > 1
        or threading.current_thread() is not threading.main_thread()
    ):
        return run()
    watcher = os.getpid()
    reads, writes = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    before = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, signal.SIGTSTP)}
    stopped: list[int] = []  # the stop signals this process had
    children: list[int] = []
    ttys = on_a_terminal()

    def pass_on(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:  # (what this one prints after: the table of a settled sweep)
            off_a_hung_up_terminal(ttys)
        stopped.append(signum)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    def suspend(signum: int, frame: Any) -> None:  # Ctrl-Z: the sweep's groups first, then this one
        held = _pause(children)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(watcher, signal.SIGTSTP)  # stopped here until continued (an orphaned group: not)
        finally:
            signal.signal(signal.SIGTSTP, suspend)
            _signal_groups(held | _groups_under(children), signal.SIGCONT)

    ours = {**dict.fromkeys(STOP_SIGNALS, pass_on), signal.SIGTSTP: suspend}
    for s, handler in ours.items():  # (before the fork: none is lost in between)
        if before[s] != signal.SIG_IGN:  # (ignored when the command began: it stays so)
            signal.signal(s, handler)
    child = os.fork()
    if child == 0:  # the driver
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        os.close(reads)
        _to_watcher.append(writes)
        _driver_side(watcher)
        try:
            code = run()
        except SystemExit as done:  # (a second Ctrl-C): it exits as it always has
            _report(writes, done.code if isinstance(done.code, int) else ExitCode.ERRORS)
            raise
        _report(writes, code)  # returned: whatever ends this process now is not news
        return code
    with contextlib.suppress(OSError):  # its group, before Ctrl-Z may name it (the child does it too)
        os.setpgid(child, child)
    children.append(child)
    if stopped:  # (one came between the fork and now)
        pass_on(stopped[-1], None)
        del stopped[-1]
    os.close(writes)
    try:
        return _watch(child, reads, stopped, settle)
    finally:
        for s, handler in before.items():
            if handler is not None:
                signal.signal(s, handler)


def _report(fd: int, code: int) -> None:
    os.write(fd, f"{int(code)}\n".encode())
    os.close(fd)
    _to_watcher.clear()


def notified() -> None:
    """In a watched driver: tell the watcher that the webhook was notified (it would otherwise
    notify it after ending the driver); elsewhere nothing."""
    for fd in _to_watcher:
        with contextlib.suppress(OSError):
            os.write(fd, NOTIFIED + b"\n")


def _pause(children: list[int]) -> set[int]:
    """SIGSTOP every process group under the children: the driver's (its Ray's own processes)
    and the one Ray gives each worker, with what the trials started; those it stopped. Looked
    at again until no new group shows (one may have been made in between)."""
    held: set[int] = set()
    while new := _groups_under(children) - held:
        _signal_groups(new, signal.SIGSTOP)  # (not SIGTSTP: a group in a session of its own ignores it)
        held |= new
    return held


def _groups_under(children: list[int]) -> set[int]:
    """The process groups of the children and every process under them, but this one's."""
    import psutil

    groups = set()
    for child in children:
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(child)
            for p in [top, *top.children(recursive=True)]:
                with contextlib.suppress(OSError):
                    groups.add(os.getpgid(p.pid))
    return groups - {os.getpgrp()}


def _signal_groups(groups: set[int], signum: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def _driver_side(watcher: int) -> None:
    """In the child: its own process group (the terminal's and a batch system's group signals
    reach the watcher, which passes them on once), death with the watcher (prctl's
    PR_SET_PDEATHSIG), and writes to the terminal from the background group allowed."""
    from tuner.sweepdir.claim import held_for

    held_for(watcher)  # (the pid a refusal names: the one the user knows)
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # (`stty tostop` would stop it at its first line)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != watcher:  # the watcher died before prctl took hold
        os._exit(ExitCode.INTERRUPTED)


def _watch(child: int, reads: int, stopped: list[int], settle: Callable[[int, bool], int]) -> int:
    """Wait for the driver (`child`); end it once its Ray is gone after a stop signal. Every
    process seen under it is remembered: a Ray killed under its driver leaves trial workers to
    init, which are ended here too (no process of the sweep outlives it)."""
    import psutil

    os.set_blocking(reads, False)
    said = b""
    seen: dict[int, Any] = {}  # pid -> psutil.Process (identity kept: a reused pid is not ours)
    ray: list[Any] = []  # its Ray's own processes, as seen alive
    status = None
    polls, scanned_stopped = 0, False
    while status is None:
        said += _read(reads)
        done, raw = os.waitpid(child, os.WNOHANG)
        if done:
            status = raw
            break
        if polls % SCAN_EVERY == 0 or (stopped and not scanned_stopped):
            ray += [p for p in _scan(child, seen, psutil) if _name(p) in RAY_PROCESSES]
            scanned_stopped = bool(stopped)
        if stopped and ray and not _code(said) and not all(_alive(p) for p in ray):
            _end(child, seen, psutil)  # its Ray died of the signal: nothing more will come from it
            status = os.waitpid(child, 0)[1]
            break
        polls += 1
        time.sleep(POLL_S)
    said += _read(reads)
    os.close(reads)
    if _code(said):  # it returned from run(): its own exit code
        return int(_code(said))
    _end(child, seen, psutil)  # (what the driver left: it ended without cleaning up)
    code = os.waitstatus_to_exitcode(status)
    return settle(code, NOTIFIED in said.split()) if stopped else (code if code >= 0 else 128 - code)


def _code(said: bytes) -> bytes:
    """The exit code the driver reported once it returned from run(), if it did; else b""."""
    return next((word for word in said.split() if word != NOTIFIED), b"")


def _scan(child: int, seen: dict[int, Any], psutil: Any) -> list[Any]:
    """Remember the child and every process under it now; those not seen before."""
    try:
        top = psutil.Process(child)
        now = [top, *top.children(recursive=True)]
    except psutil.Error:
        return []
    new = [p for p in now if p.pid not in seen]
    seen.update((p.pid, p) for p in new)
    return new


def _name(p: Any) -> str:
    try:
        return str(p.name())
    except Exception:  # noqa: BLE001 - gone: psutil remembers no name for it
        return ""


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def _alive(p: Any) -> bool:
    import psutil

    try:
        return bool(p.is_running()) and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _end(child: int, seen: dict[int, Any], psutil: Any) -> None:
    """SIGKILL the child and every process seen under it that is still that process."""
    _scan(child, seen, psutil)
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()  # (psutil refuses a pid reused by another process)
