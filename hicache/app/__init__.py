"""The command line and the demo: what a user runs (`hicache ...`), built on the layers below.

cli.py          `hicache` and its subcommands (entry point `hicache.app.cli:main`)
usage.py        the manners every command shares (exit codes, messages)
outputs.py      what a command writes, checked before its work starts
extras.py       which pip extra provides a module the base install lacks
demo.py         `hicache demo`: a shared-prefix workload through the controller, checked
demo_serve.py   the demo's serving run;  demo_tp.py: the same across tensor-parallel ranks
demo_sizing.py  the demo's sizes from the machine;  demo_report.py: what it prints
serving.py      a minimal serving loop driving the controller (admission, decode, restores)
workload.py     shared-prefix workloads the demo and the stress benchmarks serve
"""
