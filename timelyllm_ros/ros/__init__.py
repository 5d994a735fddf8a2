"""ROS 2 nodes: thin adapters between topics and the ROS-free core."""
