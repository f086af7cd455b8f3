"""Cormorant on AWS, from the services' side: ECS task metadata and ``cormorant cloud``.

The Pulumi program that provisions the deployment is ``infra/`` (its own project); this
package holds what runs in or against a deployed stack and is installed with Cormorant.
"""
