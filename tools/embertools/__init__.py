"""Ember's Python tools' shared package: what the tools under tools/ and their tests would
otherwise each write again, and the parts of the larger tools.

The tools are still run as scripts (`python3 tools/tune.py ...`, `python3 tools/plan/plan.py ...`);
each puts tools/ on sys.path in one commented line and imports from here. Standard library only
at import time: tools/dev/device_check.py and tools/doctor.py run with a bare python3.

Shared (one copy each; the C++ twin, where there is one, is named in the module):
  errors   the tools' error types and exit statuses (usage error = 2)
  ranks    a free port, torchrun's environment for a local rank, starting and waiting for ranks
  net      loopback and interface rules: a rendezvous host, getifaddrs, NCCL's and Gloo's
           choice of interface (twin: lib/src/dist/launch.cpp)
  nvml     the driver's view through NVML (twin: lib/src/monitor/nvml.cpp)
  runs     run folders: summary.json, metrics.jsonl, config.toml

The larger tools' parts, one subpackage each: plan (tools/plan/plan.py), tune (tools/tune.py),
doctor (tools/doctor.py), device_check (tools/dev/device_check.py).
"""
