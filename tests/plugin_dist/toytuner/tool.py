"""The toy tuner's tool: prints `toy:v1:N<TAB>ns` for three perf configs of the problem it is
given. TOYTOOL_PIDFILE: write its pid there first; TOYTOOL_HANG=1: then hang, deaf to SIGTERM
(a tool that must be SIGKILLed). Both reach it through MLIRTUNA_TOOL_ENV=TOYTOOL_*."""

import os
import signal
import sys
import time
import zlib

if os.environ.get("TOYTOOL_PIDFILE"):
    with open(os.environ["TOYTOOL_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
if os.environ.get("TOYTOOL_HANG") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
base = 1000 + zlib.crc32(sys.argv[1].encode()) % 1000
for n in (1, 2, 3):
    print(f"toy:v1:{n}\t{base * n}")
print(f"toy tool on GPU {sys.argv[2]}", file=sys.stderr)
