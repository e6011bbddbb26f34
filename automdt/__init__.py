"""AutoMDT: modular data transfers whose read, network and write thread counts are tuned jointly
by one controller (the capacity controller by default, or a policy trained for the path)."""

try:
    from automdt._version import __version__
except ImportError:  # a source tree that was never built or installed: no version to tell
    __version__ = "0+unknown"
