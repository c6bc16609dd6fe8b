"""Small PyTorch modules for the real-exporter samples (needs torch; never imported by tests).

torchvision is not usable with the local torch 2.13.0 CPU wheel, so ResNet and MobileNetV2
are written here by hand.  They follow torchvision's ``resnet.py`` and ``mobilenetv2.py``
layer for layer (BasicBlock / Bottleneck v1.5 with the stride on the 3x3, downsample as
Conv1x1+BN, InvertedResidual with ReLU6 and a linear bottleneck, ``_make_divisible``,
AdaptiveAvgPool2d + flatten + Linear, Dropout before MobileNetV2's classifier) with only the
widths and the number of classes shrunk so the exported files stay small.  The transformer
models come from ``transformers`` configs with random init (no downloads).
"""

from __future__ import annotations

import torch
from torch import nn


# ----------------------------------------------------------------------------------------
# ResNet (torchvision.models.resnet)
# ----------------------------------------------------------------------------------------

def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision ResNet with ``width`` instead of 64 as the stem/base width."""

    def __init__(self, block, layers: list[int], num_classes: int = 10, width: int = 8):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                # random running stats so BatchNorm folding is actually exercised
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.normal_(m.bias, 0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(width: int = 8) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], width=width)


def resnet50(width: int = 8) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], width=width)


# ----------------------------------------------------------------------------------------
# MobileNetV2 (torchvision.models.mobilenetv2)
# ----------------------------------------------------------------------------------------

def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    """torchvision Conv2dNormActivation with BatchNorm2d and ReLU6."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups,
                      bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision MobileNetV2 (same inverted-residual settings), small width_mult."""

    def __init__(self, num_classes: int = 10, width_mult: float = 0.25,
                 last_channel: int | None = None):
        super().__init__()
        settings = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                    [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
        input_channel = _make_divisible(32 * width_mult)
        # torchvision hard-codes 1280 * max(1, width_mult); a smaller value keeps files small
        self.last_channel = last_channel or _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in settings:
            output_channel = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel,
                                                 s if i == 0 else 1, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2), nn.Linear(self.last_channel,
                                                                     num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.normal_(m.bias, 0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ----------------------------------------------------------------------------------------
# transformers models (random init, wrapped to return plain tensors)
# ----------------------------------------------------------------------------------------

class GPT2Logits(nn.Module):
    """GPT2LMHeadModel returning only the logits (no KV cache)."""

    def __init__(self, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, vocab: int = 256,
                 n_positions: int = 128, n_inner: int | None = None, attn: str = "sdpa"):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
                         n_positions=n_positions, n_inner=n_inner, use_cache=False,
                         bos_token_id=vocab - 1, eos_token_id=vocab - 1,
                         attn_implementation=attn)
        self.model = GPT2LMHeadModel(cfg)

    def forward(self, input_ids, attention_mask):
        # attention_mask is passed (as most GPT-2 export scripts do); without it transformers
        # 5 calls torch.diff for packed-sequence detection, which TorchScript cannot export
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False).logits


class BertHidden(nn.Module):
    """BertModel (hidden 32, 2 heads, 2 layers) returning (last_hidden_state, pooler_output)."""

    def __init__(self, attn: str = "sdpa"):
        super().__init__()
        from transformers import BertConfig, BertModel
        cfg = BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=128,
                         max_position_embeddings=128, type_vocab_size=2,
                         attn_implementation=attn)
        self.model = BertModel(cfg)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


class ViTLogits(nn.Module):
    """ViTForImageClassification (image 32, patch 8, hidden 32) returning the logits."""

    def __init__(self, attn: str = "sdpa"):
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification
        cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32,
                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        num_labels=10, attn_implementation=attn)
        self.model = ViTForImageClassification(cfg)

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits
