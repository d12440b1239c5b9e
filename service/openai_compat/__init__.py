"""Front door 2, ``/v1/fine_tuning``: OpenAI's fine-tuning shapes mapped onto native jobs."""
