"""Functional regression suite: does a variant still answer correctly, and the same way?"""
