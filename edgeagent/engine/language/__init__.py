"""Language models in the engine: continuous batching over a generative runtime session.

``plane.LanguagePlane`` is what the transports call (OpenAI and Ollama routes); below it a
``scheduler.Scheduler`` per loaded model drives one session, with ``sampling``, ``text``
(UTF-8 and stop strings), ``prefix`` (shared prompt prefixes), ``chat`` (the model's own
template) and ``metrics`` written once for every generative runtime.
"""
