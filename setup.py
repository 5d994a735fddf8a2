from setuptools import find_packages, setup

package_name = "timelyllm_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(include=[package_name, f"{package_name}.*"]),
    python_requires=">=3.10",
    install_requires=["numpy", "PyYAML", "transitions", "scipy", "matplotlib", "rosbags", "mcap", "tqdm"],
    maintainer="TimelyLLM-ROS developers",
    description="Time-utility scheduling of segmented LLM plan generation for ROS 2 robot fleets",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "timelyllm = timelyllm_ros.cli.main:main",
        ],
        # Scheduling policies beyond the core's own, loaded by name on first use
        # (timelyllm_ros.core.policies.registry).
        "timelyllm_ros.policies": [
            "bros = timelyllm_ros.papers.bros.policy:BROS",
            "bros-recompute = timelyllm_ros.papers.bros.policy:BROS_RECOMPUTE",
            "timelyllm-bros = timelyllm_ros.papers.bros.policy:TIMELYLLM_BROS",
            "hybrid = timelyllm_ros.papers.hybrid.policy:HYBRID",
            "hybrid-nogate = timelyllm_ros.papers.hybrid.policy:HYBRID_NOGATE",
            "lamps = timelyllm_ros.papers.lamps.policy:LAMPS",
            "infercept = timelyllm_ros.papers.lamps.policy:INFERCEPT",
            "timelyllm-lamps = timelyllm_ros.papers.lamps.policy:TIMELYLLM_LAMPS",
            "mcsf = timelyllm_ros.papers.mcsf.policy:MCSF",
            "mcsf-utility = timelyllm_ros.papers.mcsf.policy:MCSF_UTILITY",
            "mcsf-shared = timelyllm_ros.papers.mcsf.policy:MCSF_SHARED",
            "timelyllm-mcsf = timelyllm_ros.papers.mcsf.policy:TIMELYLLM_MCSF",
            "mcsf-alpha-greedy = timelyllm_ros.papers.mcsf.baselines:MCSF_ALPHA_GREEDY",
            "mcsf-alpha-beta = timelyllm_ros.papers.mcsf.baselines:MCSF_ALPHA_BETA",
        ],
        # Robot backends by kind: builder(**params) -> backend (timelyllm_ros.robots.factory).
        "timelyllm_ros.robots": [
            "sim = timelyllm_ros.robots.factory:build_sim",
            "drone-sim = timelyllm_ros.robots.factory:build_drone_sim",
            "tello = timelyllm_ros.robots.factory:build_tello",
            "arm-sim = timelyllm_ros.robots.factory:build_arm_sim",
            "replay = timelyllm_ros.robots.factory:build_replay",
            "action-bridge = timelyllm_ros.robots.action_bridge:build_action_bridge",
        ],
    },
)
