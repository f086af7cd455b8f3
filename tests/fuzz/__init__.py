"""Coverage-guided fuzzing of the sans-IO MQTT core (atheris): targets, runner, corpus."""
