"""Measure the live stack's costs and fit the simulator's cost model to them."""
