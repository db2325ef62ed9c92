"""rlsched.real"""
