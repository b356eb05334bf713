"""The placement MILPs and what they stand on: node classes, the class model, the paper's model,
the linear-model builder and the solver adapters (HiGHS default, Gurobi when licensed)."""
