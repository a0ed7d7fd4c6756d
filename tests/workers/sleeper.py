import signal
import sys
import time


def on_term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(120)
