"""The doctor's parts (tools/doctor.py is its command line): common (thresholds, Options, Result),
facts (the machine read once, Probe) and checks (the judging). The network and NVML rules it
shares with the launcher are embertools.net and embertools.nvml. Standard library only."""
