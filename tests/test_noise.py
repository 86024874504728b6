"""The noise check counts an engine's own processes as the run's, not as another load."""

import subprocess
import sys

from specbench.analysis import noise

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def test_a_living_child_counts_as_own_time():
    script = "input()\n" + BURN.format(seconds=1.0) + "print(flush=True)\ninput()"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = noise.own_cpu_seconds()
        child.stdin.write("\n")
        child.stdin.flush()
        child.stdout.readline()  # the burn is over; the child lives on until it reads another line
        during = noise.own_cpu_seconds()
    finally:
        child.communicate("\n")
    assert during - before >= 0.9  # the child's burn, all of it after the first sample


def test_an_ended_child_stays_counted():
    before = noise.own_cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN.format(seconds=0.5)], check=True)
    assert noise.own_cpu_seconds() - before >= 0.4
