"""The core's own plugins: its tiers, policies and commands, registered through the
same hooks as any third-party plugin.

These modules sit above the plugin machinery: `kvtiers.plugins.registry` loads them
by module name (`DEFAULT_PLUGINS` there) and imports nothing they register. Each one
imports only the record types and names code lazily ("module:attr" strings), so
loading the registry imports no tier, policy, command, manager or torch.
"""
