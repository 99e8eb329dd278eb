"""worldloop: real_robot — the ROS-free real-time runtime.

- `fusion/`: chunk fusers (naive, temporal_ensemble, weighted_average, rail, rtc) behind `ChunkFuser`
- `safety.py`, `watchdog.py`: limits on every command, rejection of bad actions, braking to a hold
- `inference.py`, `policy_server.py`: inference beside the control loop (thread, or a localhost server)
- `runtime.py`: the fixed-rate control loop (real time or lock-step) with delay alignment
- `robots.py`, `recorder.py`, `deploy.py`: LeRobot robots and the sim robot, recording, the deploy entry
"""
