"""rlsched.sim"""
