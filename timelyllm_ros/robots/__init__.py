"""Robot backends: what executing a skill segment means on each kind of robot. No ROS here;
the executor node (timelyllm_ros/ros/executor_node.py) drives them.

    backend.py   SkillBackend: the interface, `execute(calls) -> (success, message)`, which
                 never raises
    factory.py   make_backend(kind, **params): the executor's `backend` parameter -> a backend

Kinds (`make_backend`):

    sim       SimulatedBackend: sleeps for durations sampled from the execution-time model
              (robots/sim.py)
    tello     TelloBackend: a DJI/Ryze Tello over the SDK's UDP protocol (robots/tello/);
              try it without a drone against tools/tello_emulator.py
    arm-sim   ArmBackend(SimulatedArmDriver): the arm skill set with modelled timings
              (robots/arm.py); bind a real arm with ArmBackend(YourArmDriver())
    replay    ReplayBackend: replays the exact durations of a recorded timing table
              (robots/replay.py; `timelyllm lrtrace replay --durations-from`)
"""
