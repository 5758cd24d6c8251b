"""The pure runtime core: no Django, Celery or Channels import anywhere below here.

The Django layer drives it through the protocols in :mod:`runtime.protocols`.

Entry points for the Django side:

* :func:`runtime.config.parse_policy` / ``PolicyError`` / ``check_policy``: validate an agent
  version's runtime policy when it is saved; ``DEFAULT_POLICY`` is the documented default document.
* :func:`runtime.config.build_runtime`: policy + ``AgentConfig`` -> ``Runtime``;
  ``runtime.loop(model, tools, store, sink=...)`` gives the ``AgentLoop``; ``loop.run(run_id)``.
* :func:`runtime.context.assemble_context`: the initial ``Checkpoint`` of a new run.
* :mod:`runtime.state`: the state keys the runtime reads and writes.
* :mod:`runtime.memory`: in-memory store, executor and sink (tests, benchmarks).

Modules: ``loop`` (state machine), ``step`` (what a step commits), ``calls`` (one model/tool call),
``hooks``, ``interceptors``, ``limits`` (call limits, tiers, loop detection), ``budgets``,
``compaction`` (summarization, compression, context editing), ``context`` (contributors),
``config`` + ``policy_document`` (the policy, a typed document: ``documents``), ``plugins`` (the table of
hook and interceptor kinds: built-ins and installed packages' entry points), ``serde`` (JSON), ``scripted`` (test model), ``tokens``.
"""
