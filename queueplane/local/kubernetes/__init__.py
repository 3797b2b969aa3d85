"""A real single-node Kubernetes on this machine, for deploying queue workers with Helm locally.

Binaries are built from Go modules (build), images from Debian's packages (images), and the
daemons run as host processes (cluster); DESIGN.md beside this file says why each choice.
"""
