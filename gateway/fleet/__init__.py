"""Sharing routing state: gateway instances through Redis (``sync``), one gateway's
worker processes through the supervisor's hub (``local``); ``shared`` is what both do.
"""
