"""rlsched.traces"""
