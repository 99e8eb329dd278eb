"""worldloop: real_robot — the ROS-free real-time runtime.

- `fusion/`: chunk fusers (naive, temporal_ensemble, weighted_average, rail, rtc) behind `ChunkFuser`
- `safety.py`, `watchdog.py`: limits on every command (from any start), rejection of bad actions, the
  tracking guard (measured vs commanded), braking to a hold
- `inference.py`, `policy_server.py`: inference beside the control loop (thread, or a bounded TCP server)
- `runtime.py`: the fixed-rate control loop (real time or lock-step) with delay alignment, and the stop
  (brake, rest pose, hold) that signals cannot cut short
- `robots.py`, `recorder.py`, `deploy.py`: LeRobot robots and the sim robot, crash-safe recording in
  segments, the deploy entry
- `fault_injection.py`: test doubles and fault generators (fake robots and policies, malformed server
  messages, a deploy run in a child process) for the tests and benchmarks/runtime_faults.py; the runtime
  never imports it
"""
