"""What to try next: search algorithms by name, Ray searchers and ASHA's schedule."""
