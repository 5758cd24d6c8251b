"""Human approvals: the policy that says when (policy), the gate in the tool pipeline (gate), the decisions.

Above ``tools`` (it gates tool calls), below ``agents`` (which builds the gate into each run and
registers how a decided request resumes its run, see ``tools/handlers.py``).
"""
