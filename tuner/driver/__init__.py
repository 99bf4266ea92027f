"""Run, resume and finish one sweep on Ray: preflight, the Tuner, the callbacks."""
