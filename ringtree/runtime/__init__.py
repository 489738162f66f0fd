"""Running calls: the planner (spec → plan), the compiled plan, the executor and its
steps, who drives progress, and the LL protocol's runner."""
