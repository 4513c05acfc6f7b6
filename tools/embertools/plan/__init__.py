"""The planner's parts (tools/plan/plan.py is its command line), one module per part of its
specification in docs/planning.md ("The planner's model"): constants, arithmetic, inputs, rows,
configs, nodes, layouts (pipeline x tensor x data), formats, render. Standard library only."""
