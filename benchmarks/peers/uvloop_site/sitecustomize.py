"""On ``PYTHONPATH`` for the plain-asyncio baseline's uvloop column: every
interpreter it starts (controller, cold-start children, actor processes)
runs ``asyncio`` on uvloop, as meshio's workers always do."""

import asyncio

import uvloop

asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
