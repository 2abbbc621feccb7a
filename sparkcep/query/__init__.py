"""The query API: streams, operators, expressions, windows, aggregate functions, the planner."""
