"""Backend `tello`: a DJI/Ryze Tello over its SDK's UDP protocol, one module per job.

    sdk.py         TelloClient: the UDP command link and state stream (ordering, timeouts,
                   retries, keep-alive), in SDK commands only
    translate.py   MiniSpec skill calls -> SDK steps (pure; the skill mapping table)
    timings.py     TelloTimings: expected command durations, from which timeouts derive
    backend.py     TelloBackend: the executor's SkillBackend, a TelloClient that runs the
                   translated steps

Try it without a drone against tools/tello_emulator.py (tools/README.md).
"""
