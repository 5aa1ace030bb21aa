import not_a_real_package_for_spindle  # noqa: F401  (fails to import, on purpose)

graph = None
