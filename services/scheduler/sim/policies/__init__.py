"""Scheduling policies the simulator can replay a trace through (see docs/simulator.md, "Policies")."""
