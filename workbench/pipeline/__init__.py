"""Pipeline parallelism: schedules as data, stages, executor."""
