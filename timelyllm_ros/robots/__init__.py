"""Robot backends: what executing a skill segment means on each kind of robot. No ROS here;
the executor node (timelyllm_ros/ros/executor_node.py) drives them.

    backend.py   SkillBackend: the interface, `execute(calls) -> (success, message)`, which
                 never raises
    factory.py   make_backend(kind, **params): the executor's `backend` parameter -> a backend

Interpreting plans: a backend with a `runtime` attribute (drone-sim, tello, arm-sim) runs
segments with core/skills/interpreter.py's TaskInterpreter(language, backend.runtime), one per
task: loops, conditionals and variables on the robot. Plug-in kinds come from the
`timelyllm_ros.robots` entry-point group (factory.py; README "Adding a robot backend").

Kinds (`make_backend`):

    sim       SimulatedBackend: sleeps for durations sampled from the execution-time model
              (robots/sim.py)
    drone-sim SimDroneBackend: a drone in a scene (robots/drone_sim.py, robots/scene.py,
              config/scenes/) whose skills return what it would observe; interprets MiniSpec
    tello     TelloBackend: a DJI/Ryze Tello over the SDK's UDP protocol (robots/tello/);
              try it without a drone against tools/tello_emulator.py
    arm-sim   ArmBackend(SimulatedArmDriver): the arm skill set with modelled timings
              (robots/arm.py); bind a real arm with ArmBackend(YourArmDriver())
    replay    ReplayBackend: replays the exact durations of a recorded timing table
              (robots/replay.py; `timelyllm lrtrace replay --durations-from`)
"""
