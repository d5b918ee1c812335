"""Watches on the query stream of one client (`QueryDefense`): query budgets and detectors of
model extraction (PRADA, Juuti et al. 2019). Modules here are discovered on import."""
