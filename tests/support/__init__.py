"""Test support: a Kubernetes API emulator (built on kmock) and a fake kubelet.

The fast test tier runs the real operator process against these over HTTP; see
docs/operator.md for what is emulated and where the emulator deliberately cuts corners.
"""
