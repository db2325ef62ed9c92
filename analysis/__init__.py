"""rlsched.analysis"""
