// Declaration-only stand-in for
// <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>, written from
// Apple's public documentation
// (developer.apple.com/documentation/metalperformanceshadersgraph) for a
// syntax check on Linux; not Apple's header. It declares only what PyTorch's
// MPS sources and the stream-pool patch use, with Apple's names and types;
// nullability and availability annotations are left out.
#pragma once
#include <MetalPerformanceShaders/MetalPerformanceShaders.h>

@class MPSGraphOperation;
@class MPSGraphTensor;
@class MPSGraphTensorData;

// --- Core objects -----------------------------------------------------------

@interface MPSGraphObject : NSObject
@end

@interface MPSGraphTensor : MPSGraphObject<NSCopying>
@property(readonly, copy) MPSShape* shape;
@property(readonly) MPSDataType dataType;
@end

@interface MPSGraphOperation : MPSGraphObject<NSCopying>
@end

@interface MPSGraphTensorData : MPSGraphObject
@property(readonly, copy) MPSShape* shape;
@property(readonly) MPSDataType dataType;
- (instancetype)initWithMTLBuffer:(id<MTLBuffer>)buffer shape:(MPSShape*)shape dataType:(MPSDataType)dataType;
- (instancetype)initWithMPSNDArray:(MPSNDArray*)ndarray;
@end

typedef NSDictionary<MPSGraphTensor*, MPSGraphTensorData*> MPSGraphTensorDataDictionary;

// --- Compilation and execution ----------------------------------------------

typedef NS_ENUM(uint64_t, MPSGraphOptimization) {
  MPSGraphOptimizationLevel0 = 0,
  MPSGraphOptimizationLevel1 = 1,
};

@interface MPSGraphCompilationDescriptor : MPSGraphObject<NSCopying>
@property(readwrite, nonatomic) MPSGraphOptimization optimizationLevel;
@end

typedef void (^MPSGraphExecutionCompletionHandler)(MPSGraphTensorDataDictionary* resultsDictionary, NSError* error);
typedef void (^MPSGraphExecutionScheduledHandler)(MPSGraphTensorDataDictionary* resultsDictionary, NSError* error);

@interface MPSGraphExecutionDescriptor : MPSGraphObject
@property(readwrite, atomic) MPSGraphExecutionScheduledHandler scheduledHandler;
@property(readwrite, atomic) MPSGraphExecutionCompletionHandler completionHandler;
@property(readwrite, atomic) BOOL waitUntilCompleted;
@property(readwrite, atomic, copy) MPSGraphCompilationDescriptor* compilationDescriptor;
- (void)waitForEvent:(id<MTLSharedEvent>)event value:(uint64_t)value;
@end

// --- Enumerations used by operation signatures ------------------------------

typedef NS_ENUM(NSUInteger, MPSGraphTensorNamedDataLayout) {
  MPSGraphTensorNamedDataLayoutNCHW = 0,
  MPSGraphTensorNamedDataLayoutNHWC = 1,
  MPSGraphTensorNamedDataLayoutOIHW = 2,
  MPSGraphTensorNamedDataLayoutHWIO = 3,
  MPSGraphTensorNamedDataLayoutCHW = 4,
  MPSGraphTensorNamedDataLayoutHWC = 5,
  MPSGraphTensorNamedDataLayoutHW = 6,
  MPSGraphTensorNamedDataLayoutNCDHW = 7,
  MPSGraphTensorNamedDataLayoutNDHWC = 8,
  MPSGraphTensorNamedDataLayoutOIDHW = 9,
  MPSGraphTensorNamedDataLayoutDHWIO = 10,
};

typedef NS_ENUM(NSUInteger, MPSGraphPaddingStyle) {
  MPSGraphPaddingStyleExplicit = 0,
  MPSGraphPaddingStyleTF_VALID = 1,
  MPSGraphPaddingStyleTF_SAME = 2,
  MPSGraphPaddingStyleExplicitOffset = 3,
  MPSGraphPaddingStyleONNX_SAME_LOWER = 4,
};

typedef NS_ENUM(NSInteger, MPSGraphPaddingMode) {
  MPSGraphPaddingModeConstant = 0,
  MPSGraphPaddingModeReflect = 1,
  MPSGraphPaddingModeSymmetric = 2,
  MPSGraphPaddingModeClampToEdge = 3,
  MPSGraphPaddingModeZero = 4,
  MPSGraphPaddingModePeriodic = 5,
  MPSGraphPaddingModeAntiPeriodic = 6,
};

typedef NS_ENUM(NSUInteger, MPSGraphResizeMode) {
  MPSGraphResizeNearest = 0,
  MPSGraphResizeBilinear = 1,
};

typedef NS_ENUM(NSUInteger, MPSGraphResizeNearestRoundingMode) {
  MPSGraphResizeNearestRoundingModeRoundPreferCeil = 0,
  MPSGraphResizeNearestRoundingModeRoundPreferFloor = 1,
  MPSGraphResizeNearestRoundingModeCeil = 2,
  MPSGraphResizeNearestRoundingModeFloor = 3,
  MPSGraphResizeNearestRoundingModeRoundToEven = 4,
  MPSGraphResizeNearestRoundingModeRoundToOdd = 5,
};

typedef NS_ENUM(NSUInteger, MPSGraphFFTScalingMode) {
  MPSGraphFFTScalingModeNone = 0,
  MPSGraphFFTScalingModeSize = 1,
  MPSGraphFFTScalingModeUnitary = 2,
};

// Scatter (MPSGraphScatterOps.h and friends)
typedef NS_ENUM(NSInteger, MPSGraphScatterMode) {
  MPSGraphScatterModeAdd = 0,
  MPSGraphScatterModeSub = 1,
  MPSGraphScatterModeMul = 2,
  MPSGraphScatterModeDiv = 3,
  MPSGraphScatterModeMin = 4,
  MPSGraphScatterModeMax = 5,
  MPSGraphScatterModeSet = 6,
};

// Random (MPSGraphRandomOps.h)
typedef NS_ENUM(uint64_t, MPSGraphRandomDistribution) {
  MPSGraphRandomDistributionUniform = 0,
  MPSGraphRandomDistributionNormal = 1,
  MPSGraphRandomDistributionTruncatedNormal = 2,
};

typedef NS_ENUM(uint64_t, MPSGraphRandomNormalSamplingMethod) {
  MPSGraphRandomNormalSamplingInvCDF = 0,
  MPSGraphRandomNormalSamplingBoxMuller = 1,
};

@interface MPSGraphRandomOpDescriptor : MPSGraphObject<NSCopying>
@property(readwrite, nonatomic) MPSGraphRandomDistribution distribution;
@property(readwrite, nonatomic) MPSDataType dataType;
@property(readwrite, nonatomic) float min;
@property(readwrite, nonatomic) float max;
@property(readwrite, nonatomic) NSInteger minInteger;
@property(readwrite, nonatomic) NSInteger maxInteger;
@property(readwrite, nonatomic) float mean;
@property(readwrite, nonatomic) float standardDeviation;
@property(readwrite, nonatomic) MPSGraphRandomNormalSamplingMethod samplingMethod;
+ (instancetype)descriptorWithDistribution:(MPSGraphRandomDistribution)distribution dataType:(MPSDataType)dataType;
@end

@interface MPSGraphFFTDescriptor : MPSGraphObject<NSCopying>
@property(readwrite, nonatomic) BOOL inverse;
@property(readwrite, nonatomic) MPSGraphFFTScalingMode scalingMode;
@property(readwrite, nonatomic) BOOL roundToOddHermitean;
+ (instancetype)descriptor;
@end

@interface MPSGraphConvolution3DOpDescriptor : MPSGraphObject<NSCopying>
@property(readwrite, nonatomic) NSUInteger strideInX;
@property(readwrite, nonatomic) NSUInteger strideInY;
@property(readwrite, nonatomic) NSUInteger strideInZ;
@property(readwrite, nonatomic) NSUInteger dilationRateInX;
@property(readwrite, nonatomic) NSUInteger dilationRateInY;
@property(readwrite, nonatomic) NSUInteger dilationRateInZ;
@property(readwrite, nonatomic) NSUInteger paddingLeft;
@property(readwrite, nonatomic) NSUInteger paddingRight;
@property(readwrite, nonatomic) NSUInteger paddingTop;
@property(readwrite, nonatomic) NSUInteger paddingBottom;
@property(readwrite, nonatomic) NSUInteger paddingFront;
@property(readwrite, nonatomic) NSUInteger paddingBack;
@property(readwrite, nonatomic) MPSGraphPaddingStyle paddingStyle;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout dataLayout;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout weightsLayout;
@property(readwrite, nonatomic) NSUInteger groups;
@end

// --- The graph --------------------------------------------------------------

@interface MPSGraph : MPSGraphObject
+ (instancetype)new;
- (instancetype)init;

- (MPSGraphTensor*)placeholderWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType name:(NSString*)name;
- (MPSGraphTensor*)constantWithScalar:(double)scalar dataType:(MPSDataType)dataType;
- (MPSGraphTensor*)constantWithScalar:(double)scalar shape:(MPSShape*)shape dataType:(MPSDataType)dataType;

- (void)encodeToCommandBuffer:(MPSCommandBuffer*)commandBuffer
                        feeds:(MPSGraphTensorDataDictionary*)feeds
             targetOperations:(NSArray<MPSGraphOperation*>*)targetOperations
            resultsDictionary:(MPSGraphTensorDataDictionary*)resultsDictionary
          executionDescriptor:(MPSGraphExecutionDescriptor*)executionDescriptor;

// Arithmetic (MPSGraphArithmeticOps.h)
- (MPSGraphTensor*)identityWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)squareWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)squareRootWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)reciprocalSquareRootWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)reverseSquareRootWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)reciprocalWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)conjugateWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)additionWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                             secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                        name:(NSString*)name;
- (MPSGraphTensor*)subtractionWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                           name:(NSString*)name;
- (MPSGraphTensor*)multiplicationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                   secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                              name:(NSString*)name;
- (MPSGraphTensor*)minimumWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                            secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                       name:(NSString*)name;
- (MPSGraphTensor*)maximumWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                            secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                       name:(NSString*)name;
- (MPSGraphTensor*)minimumWithNaNPropagationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                              secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                                         name:(NSString*)name;
- (MPSGraphTensor*)maximumWithNaNPropagationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                              secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                                         name:(NSString*)name;

// Matrix multiplication (MPSGraphMatrixMultiplicationOps.h)
- (MPSGraphTensor*)matrixMultiplicationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                         secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                                    name:(NSString*)name;

// Reductions (MPSGraphReductionOps.h)
- (MPSGraphTensor*)reductionSumWithTensor:(MPSGraphTensor*)tensor axis:(NSInteger)axis name:(NSString*)name;
- (MPSGraphTensor*)reductionSumWithTensor:(MPSGraphTensor*)tensor axes:(NSArray<NSNumber*>*)axes name:(NSString*)name;

// Shape and type (MPSGraphTensorShapeOps.h)
- (MPSGraphTensor*)reshapeTensor:(MPSGraphTensor*)tensor withShape:(MPSShape*)shape name:(NSString*)name;
- (MPSGraphTensor*)transposeTensor:(MPSGraphTensor*)tensor
                         dimension:(NSUInteger)dimensionIndex
                     withDimension:(NSUInteger)dimensionIndex2
                              name:(NSString*)name;
- (MPSGraphTensor*)flatten2DTensor:(MPSGraphTensor*)tensor axis:(NSInteger)axis name:(NSString*)name;
- (MPSGraphTensor*)castTensor:(MPSGraphTensor*)tensor toType:(MPSDataType)type name:(NSString*)name;

// Gather and scatter (MPSGraphGatherOps.h, MPSGraphScatterOps.h, MPSGraphScatterNDOps.h)
- (MPSGraphTensor*)gatherWithUpdatesTensor:(MPSGraphTensor*)updatesTensor
                             indicesTensor:(MPSGraphTensor*)indicesTensor
                                      axis:(NSUInteger)axis
                           batchDimensions:(NSUInteger)batchDimensions
                                      name:(NSString*)name;
- (MPSGraphTensor*)scatterWithDataTensor:(MPSGraphTensor*)dataTensor
                           updatesTensor:(MPSGraphTensor*)updatesTensor
                           indicesTensor:(MPSGraphTensor*)indicesTensor
                                    axis:(NSInteger)axis
                                    mode:(MPSGraphScatterMode)mode
                                    name:(NSString*)name;
- (MPSGraphTensor*)scatterNDWithDataTensor:(MPSGraphTensor*)dataTensor
                             updatesTensor:(MPSGraphTensor*)updatesTensor
                             indicesTensor:(MPSGraphTensor*)indicesTensor
                           batchDimensions:(NSUInteger)batchDimensions
                                      mode:(MPSGraphScatterMode)mode
                                      name:(NSString*)name;
- (MPSGraphTensor*)scatterNDWithUpdatesTensor:(MPSGraphTensor*)updatesTensor
                                indicesTensor:(MPSGraphTensor*)indicesTensor
                                        shape:(MPSShape*)shape
                              batchDimensions:(NSUInteger)batchDimensions
                                         mode:(MPSGraphScatterMode)mode
                                         name:(NSString*)name;

// Random (MPSGraphRandomOps.h)
- (NSArray<MPSGraphTensor*>*)randomTensorWithShape:(MPSShape*)shape
                                        descriptor:(MPSGraphRandomOpDescriptor*)descriptor
                                       stateTensor:(MPSGraphTensor*)state
                                              name:(NSString*)name;

// Normalization (MPSGraphNormalizationOps.h)
- (MPSGraphTensor*)meanOfTensor:(MPSGraphTensor*)tensor axes:(NSArray<NSNumber*>*)axes name:(NSString*)name;
- (MPSGraphTensor*)varianceOfTensor:(MPSGraphTensor*)tensor axes:(NSArray<NSNumber*>*)axes name:(NSString*)name;
- (MPSGraphTensor*)varianceOfTensor:(MPSGraphTensor*)tensor
                         meanTensor:(MPSGraphTensor*)meanTensor
                               axes:(NSArray<NSNumber*>*)axes
                               name:(NSString*)name;
- (MPSGraphTensor*)normalizationWithTensor:(MPSGraphTensor*)tensor
                                meanTensor:(MPSGraphTensor*)mean
                            varianceTensor:(MPSGraphTensor*)variance
                               gammaTensor:(MPSGraphTensor*)gamma
                                betaTensor:(MPSGraphTensor*)beta
                                   epsilon:(float)epsilon
                                      name:(NSString*)name;
- (MPSGraphTensor*)normalizationGammaGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradientTensor
                                                           sourceTensor:(MPSGraphTensor*)sourceTensor
                                                             meanTensor:(MPSGraphTensor*)meanTensor
                                                         varianceTensor:(MPSGraphTensor*)varianceTensor
                                                          reductionAxes:(NSArray<NSNumber*>*)axes
                                                                epsilon:(float)epsilon
                                                                   name:(NSString*)name;
- (MPSGraphTensor*)normalizationBetaGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradientTensor
                                                          sourceTensor:(MPSGraphTensor*)sourceTensor
                                                         reductionAxes:(NSArray<NSNumber*>*)axes
                                                                  name:(NSString*)name;
- (MPSGraphTensor*)normalizationGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradientTensor
                                                      sourceTensor:(MPSGraphTensor*)sourceTensor
                                                        meanTensor:(MPSGraphTensor*)meanTensor
                                                    varianceTensor:(MPSGraphTensor*)varianceTensor
                                                       gammaTensor:(MPSGraphTensor*)gamma
                                               gammaGradientTensor:(MPSGraphTensor*)gammaGradient
                                                betaGradientTensor:(MPSGraphTensor*)betaGradient
                                                     reductionAxes:(NSArray<NSNumber*>*)axes
                                                           epsilon:(float)epsilon
                                                              name:(NSString*)name;
@end
