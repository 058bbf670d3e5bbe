"""Several gateway instances sharing routing state through Redis.
"""
