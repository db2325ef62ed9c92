"""rlsched.policies"""
