from setuptools import find_packages, setup

package_name = "timelyllm_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(include=[package_name, f"{package_name}.*"]),
    python_requires=">=3.10",
    install_requires=["numpy", "PyYAML", "transitions", "scipy", "matplotlib", "rosbags"],
    maintainer="TimelyLLM-ROS developers",
    description="Time-utility scheduling of segmented LLM plan generation for ROS 2 robot fleets",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "timelyllm = timelyllm_ros.cli:main",
        ],
    },
)
